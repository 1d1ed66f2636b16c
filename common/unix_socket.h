// Unix-domain socket helpers: listening and connecting, message passing with file descriptors
// (SCM_RIGHTS), and the peer's credentials (SO_PEERCRED).
//
//   ASSIGN_OR_RETURN(UniqueFd listener, ListenUnix(path, SOCK_SEQPACKET, 0660));
//   ASSIGN_OR_RETURN(UniqueFd conn, ConnectUnix(path, SOCK_SEQPACKET));
//   RETURN_IF_ERROR(SendMessage(conn.get(), bytes, {memfd}));
//
// All functions are thread-compatible; they block only where the socket blocks.
#ifndef COMMD_COMMON_UNIX_SOCKET_H_
#define COMMD_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace commd {

// Most file descriptors one message carries.
inline constexpr int kMaxFdsPerMessage = 16;
// The largest packet either side of the daemon's fd channel takes (daemon/server/
// handle_channel.h): its requests and answers are a few hundred bytes.
inline constexpr size_t kMaxHandlePacketBytes = 64 * 1024;

// Binds and listens on `path` (which must not exist), then sets its mode. The socket is
// close-on-exec; add SOCK_NONBLOCK to `type` for a non-blocking listener.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, mode_t mode);

// Connects to `path`. ENOENT/ECONNREFUSED become UNAVAILABLE naming the path.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type);

// Sends one message (one packet on SOCK_SEQPACKET) with up to kMaxFdsPerMessage fds. The
// caller keeps ownership of `fds`.
absl::Status SendMessage(int sock, absl::string_view bytes, std::span<const int> fds = {});

struct ReceivedMessage {
  std::string bytes;
  std::vector<UniqueFd> fds;
  bool truncated = false;  // the packet was larger than max_bytes
};

// Receives one message of at most `max_bytes`. A closed peer is UNAVAILABLE ("connection
// closed by peer"); on a non-blocking socket with nothing to read, nullopt.
absl::StatusOr<std::optional<ReceivedMessage>> ReceiveMessage(int sock, size_t max_bytes);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (SO_PEERGROUPS)
};

// The credentials the kernel recorded for the peer when it connected, with its
// supplementary groups.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock);

}  // namespace commd

#endif  // COMMD_COMMON_UNIX_SOCKET_H_
