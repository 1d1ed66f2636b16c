// Client sessions: who is connected, under which job, with which token.
//
// A session opens on the fd channel, where the kernel vouches for the peer's uid and pid
// (SO_PEERCRED). The token it returns is the client's proof on every gRPC call, since gRPC
// cannot see peer credentials. A session ends when its process exits (watched with a pidfd)
// or when it is closed.
//
//   ASSIGN_OR_RETURN(auto session, sessions.Open(creds, "job-42"));
//   ASSIGN_OR_RETURN(auto same, sessions.Authenticate(session->token));
//
// Thread-safe.
#ifndef COMMD_DAEMON_SERVER_SESSIONS_H_
#define COMMD_DAEMON_SERVER_SESSIONS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/event_loop.h"
#include "daemon/server/process_exit.h"
#include "daemon/server/timer_queue.h"

namespace commd::server {

struct Session {
  std::string token;
  std::string job_id;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  bool admin = false;  // uid 0 or a member of the admin group
  absl::Time opened;
};

// Why a session ended. `reason` is the metric label: "closed" (the client closed it, or its
// connection closed while its process lives on) or "process_exited" (its process exited with
// the session open). `exit` says how that process ended (process_exited only).
struct SessionEnd {
  std::string reason;
  ProcessExit exit;
  bool process_exited() const { return reason == "process_exited"; }
};

struct SessionLimits {
  uint32_t max_sessions = 4096;
  uint32_t max_sessions_per_uid = 1024;      // limits.per_uid.sessions
  gid_t admin_gid = static_cast<gid_t>(-1);  // -1: none
};

class SessionRegistry {
 public:
  // `loop`, `timers` and `metrics` must outlive the registry; the loop and the timers must be
  // stopped first.
  SessionRegistry(EventLoop* loop, TimerQueue* timers, metrics::Metrics* metrics,
                  SessionLimits limits);

  // Opens a session for the process `peer`. An empty job id means "default". Fails with
  // RESOURCE_EXHAUSTED at limits.max_sessions or limits.per_uid.sessions, INVALID_ARGUMENT
  // for a bad job id.
  absl::StatusOr<std::shared_ptr<const Session>> Open(const PeerCredentials& peer,
                                                      absl::string_view job_id);

  // The session holding `token`, or UNAUTHENTICATED.
  absl::StatusOr<std::shared_ptr<const Session>> Authenticate(absl::string_view token) const;

  // Ends the session as the client asked ("closed"): the SDK does this before it closes its
  // sockets, so a finished rank is never taken for a dead one. Returns false when `token` is
  // no open session.
  bool Close(absl::string_view token);

  // Ends the session because its fd-channel connection or its Attach stream closed:
  // "process_exited" when its process is gone, "closed" when the client closed it. A dying
  // process closes its sockets before its pidfd turns readable, so a connection that closes
  // while the process still runs is given a moment to show which it was.
  void CloseForDisconnect(absl::string_view token);

  size_t size() const;

  // Runs `listener` (on the thread that ends a session, with no registry lock held) for
  // every session that ends from now on. Register before serving; not removable.
  using EndListener = std::function<void(const Session&, const SessionEnd& end)>;
  void AddEndListener(EndListener listener);

 private:
  struct Entry {
    std::shared_ptr<const Session> session;
    UniqueFd pidfd;
  };
  void OnProcessExit(const std::string& token);
  bool End(absl::string_view token, SessionEnd end);

  EventLoop* const loop_;
  TimerQueue* const timers_;
  metrics::Metrics* const metrics_;
  const SessionLimits limits_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
  std::vector<EndListener> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_SESSIONS_H_
