// Accepts connections on one of the daemon's unix sockets with the discipline both sockets
// need against hostile or merely numerous clients: a node-wide and a per-uid cap on open
// connections (SO_PEERCRED tells the uid), and no spinning when the daemon is out of file
// descriptors (a reserve fd accepts and closes one pending connection, then the socket
// rests for a back-off; one log line per interval says how many were refused).
//
//   ASSIGN_OR_RETURN(auto acceptor, Acceptor::Start(options, loop, registry,
//       [](UniqueFd fd, const PeerCredentials& peer) { ... }));   // on the loop thread
//   acceptor->Closed(peer.uid);   // when that connection ends
//
// Refusals are counted in commd_connections_refused_total{socket,reason}; open connections
// in commd_connections{socket}. Start/Stop and the callbacks run on the EventLoop; Closed is
// thread-safe.
#ifndef COMMD_DAEMON_SERVER_ACCEPTOR_H_
#define COMMD_DAEMON_SERVER_ACCEPTOR_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/server/event_loop.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::server {

struct AcceptorOptions {
  std::string path;
  int type = 0;              // SOCK_STREAM or SOCK_SEQPACKET
  std::string socket_label;  // metric label and log name: "commd.sock", "handles.sock"
  uint32_t max_connections = 4096;
  std::string max_connections_field;  // config field named in errors
  uint32_t max_per_uid = 1024;
  absl::Duration backoff = absl::Milliseconds(200);
  // How often at most a line says how many connections were refused, per reason.
  absl::Duration log_interval = absl::Seconds(5);
  // Tells a refused client why before its connection closes (optional; a seqpacket socket
  // can answer, an HTTP/2 one cannot).
  std::function<void(int fd, const absl::Status& why)> explain;
};

class Acceptor {
 public:
  using OnAccept = std::function<void(UniqueFd fd, const PeerCredentials& peer)>;

  // Listens on options.path (mode 0660). `loop` and `registry` must outlive the acceptor,
  // and the loop must be stopped before the acceptor is destroyed.
  static absl::StatusOr<std::unique_ptr<Acceptor>> Start(AcceptorOptions options, EventLoop* loop,
                                                         prometheus::Registry* registry,
                                                         OnAccept on_accept);
  ~Acceptor() = default;

  // One connection of `uid` that was accepted has ended.
  void Closed(uid_t uid);
  // Counts a connection the owner closed for `reason` (e.g. "no_session").
  void CountDropped(absl::string_view reason);
  // Counts a connection the owner refused right after accepting it.
  void CountRefused(absl::string_view reason);

 private:
  Acceptor(AcceptorOptions options, EventLoop* loop, prometheus::Registry* registry,
           OnAccept on_accept);
  void OnReadable();
  // Accept failed for lack of fds: refuse one pending connection, rest, log at most once
  // per interval.
  void OnFdLimit(int err);
  void Resume();
  // Checks the caps for a new connection of `uid` and counts it; a refusal names the cap and
  // sets `reason` to its metric label.
  absl::Status Admit(uid_t uid, std::string* reason);
  void Refuse(int fd, absl::string_view reason, const absl::Status& why);

  const AcceptorOptions options_;
  EventLoop* const loop_;
  const OnAccept on_accept_;
  UniqueFd listener_;
  UniqueFd reserve_;  // spent to accept-and-close when the fd table is full
  bool paused_ = false;
  // Per refusal reason: when it was last logged and how many came since. One line per
  // interval, whatever a client does, keeps a hostile one from flooding the journal.
  struct LogState {
    absl::Time last = absl::InfinitePast();
    uint64_t since = 0;
  };
  std::unordered_map<std::string, LogState> log_state_;

  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
  prometheus::Family<prometheus::Counter>* dropped_ = nullptr;
  prometheus::Gauge* open_ = nullptr;
  absl::Mutex mu_;
  uint32_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

// Raises the soft RLIMIT_NOFILE to the hard limit (a daemon with thousands of clients needs
// more than the usual 1024). Returns the soft limit now in force.
absl::StatusOr<uint64_t> RaiseOpenFileLimit();

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_ACCEPTOR_H_
