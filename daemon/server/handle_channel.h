// The fd channel: the daemon's second unix socket (handles.sock, SOCK_SEQPACKET), where
// sessions open with kernel-verified credentials and where file descriptors, which gRPC
// cannot carry, are handed to clients with SCM_RIGHTS.
//
// Each packet from a client is one commd.v1.HandleRequest; each answer one HandleResponse.
// A packet that is too large or does not parse drops that connection only; the daemon keeps
// serving everyone else. Runs entirely on the EventLoop thread; never blocks on a client.
#ifndef COMMD_DAEMON_SERVER_HANDLE_CHANNEL_H_
#define COMMD_DAEMON_SERVER_HANDLE_CHANNEL_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "commd/v1/handles.pb.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/server/acceptor.h"
#include "daemon/server/event_loop.h"
#include "daemon/server/sessions.h"

namespace commd::server {

struct ImportedFd {
  UniqueFd fd;
  uint64_t bytes = 0;
};

// Redeems import tokens for process `pid` (see ImportRequest in handles.proto).
using Importer = std::function<absl::StatusOr<std::vector<ImportedFd>>(
    const std::vector<std::string>& tokens, pid_t pid)>;

struct HandleChannelOptions {
  // Path, caps (transport.max_fd_connections, limits.per_uid.fd_connections) and back-off;
  // the channel fills in the rest.
  AcceptorOptions accept;
  Importer importer;
  size_t max_packet_bytes = kMaxHandlePacketBytes;
  // A connection that opened no session within this is closed (transport.session_timeout_ms).
  absl::Duration session_timeout = absl::Seconds(10);
  std::string daemon_version;
};

class HandleChannel {
 public:
  // Listens on options.accept.path (mode 0660). `loop`, `sessions` and `registry` must outlive the
  // channel, and the loop must be stopped before the channel is destroyed.
  static absl::StatusOr<std::unique_ptr<HandleChannel>> Start(HandleChannelOptions options,
                                                              EventLoop* loop,
                                                              SessionRegistry* sessions,
                                                              prometheus::Registry* registry);

 private:
  struct Connection {
    UniqueFd fd;
    uid_t uid = 0;
    uint64_t serial = 0;  // tells a reused fd number from the connection a timer was set for
    std::vector<std::string> session_tokens;  // sessions opened here end when it closes
  };

  HandleChannel(HandleChannelOptions options, EventLoop* loop, SessionRegistry* sessions)
      : options_(std::move(options)), loop_(loop), sessions_(sessions) {}

  void OnAccept(UniqueFd conn, const PeerCredentials& peer);
  // Closes the connection if it still has opened no session.
  void CheckSessionOpened(int fd, uint64_t serial);
  void OnReadable(int fd);
  void Drop(int fd, absl::string_view why);
  // Answers one request; fds to send with the answer go to `fds`.
  v1::HandleResponse Dispatch(const v1::HandleRequest& request, const PeerCredentials& peer,
                              Connection* connection, std::vector<UniqueFd>* fds);
  v1::HandleResponse Import(const v1::ImportRequest& request, const PeerCredentials& peer,
                            std::vector<UniqueFd>* fds);

  const HandleChannelOptions options_;
  EventLoop* const loop_;
  SessionRegistry* const sessions_;
  std::unique_ptr<Acceptor> acceptor_;
  // Touched only on the loop thread.
  std::unordered_map<int, Connection> connections_;
  uint64_t next_serial_ = 0;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_HANDLE_CHANNEL_H_
