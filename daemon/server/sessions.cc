#include "daemon/server/sessions.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "common/random_token.h"
#include "common/status_macros.h"

namespace commd::server {
namespace {

// How long a disconnected session waits for its pidfd before counting as closed by the client.
constexpr absl::Duration kExitSettleTime = absl::Milliseconds(100);

absl::StatusOr<UniqueFd> PidFd(pid_t pid) {
  SYS_ASSIGN_OR_RETURN(long fd, ::syscall(SYS_pidfd_open, pid, 0));
  return UniqueFd(static_cast<int>(fd));
}

}  // namespace

SessionRegistry::SessionRegistry(EventLoop* loop, TimerQueue* timers, metrics::Metrics* metrics,
                                 SessionLimits limits)
    : loop_(loop), timers_(timers), metrics_(metrics), limits_(limits) {}

absl::StatusOr<std::shared_ptr<const Session>> SessionRegistry::Open(const PeerCredentials& peer,
                                                                     absl::string_view job_id) {
  const std::string job = job_id.empty() ? "default" : std::string(job_id);
  RETURN_IF_ERROR(ValidateJobId(job));
  ASSIGN_OR_RETURN(std::string token, RandomToken());
  ASSIGN_OR_RETURN(UniqueFd pidfd, PidFd(peer.pid));
  auto session = std::make_shared<Session>();
  session->token = token;
  session->job_id = job;
  session->uid = peer.uid;
  session->gid = peer.gid;
  session->pid = peer.pid;
  session->admin =
      peer.uid == 0 || peer.gid == limits_.admin_gid ||
      std::find(peer.groups.begin(), peer.groups.end(), limits_.admin_gid) != peer.groups.end();
  session->opened = absl::Now();
  const int watched = pidfd.get();
  {
    absl::MutexLock lock(&mu_);
    if (sessions_.size() >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session limit reached: ", sessions_.size(), " sessions open, limit ",
                       limits_.max_sessions, " (limits.max_sessions)"));
    }
    uint32_t& mine = per_uid_[peer.uid];
    if (mine >= limits_.max_sessions_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat("uid ", peer.uid, " holds ", mine,
                                                       " of its ", limits_.max_sessions_per_uid,
                                                       " sessions (limits.per_uid.sessions)"));
    }
    ++mine;
    sessions_[token] = Entry{session, std::move(pidfd)};
    metrics_->SetSessions(static_cast<double>(sessions_.size()));
  }
  RETURN_IF_ERROR(loop_->Add(watched, [this, token](uint32_t) { OnProcessExit(token); }));
  COMMD_LOG(INFO, "sessions") << "session opened: job " << job << " uid " << peer.uid << " pid "
                              << peer.pid;
  return std::shared_ptr<const Session>(std::move(session));
}

absl::StatusOr<std::shared_ptr<const Session>> SessionRegistry::Authenticate(
    absl::string_view token) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(std::string(token));
  if (it == sessions_.end()) {
    return absl::UnauthenticatedError(
        token.empty() ? "no session token: open a session on the fd channel (handles.sock) and "
                        "send its token as gRPC metadata 'commd-session'"
                      : "unknown or expired session token");
  }
  return it->second.session;
}

void SessionRegistry::AddEndListener(EndListener listener) {
  absl::MutexLock lock(&mu_);
  listeners_.push_back(std::move(listener));
}

bool SessionRegistry::Close(absl::string_view token) { return End(token, {.reason = "closed"}); }

bool SessionRegistry::End(absl::string_view token, SessionEnd end) {
  Entry entry;
  std::vector<EndListener> listeners;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(std::string(token));
    if (it == sessions_.end()) return false;
    entry = std::move(it->second);
    sessions_.erase(it);
    if (auto u = per_uid_.find(entry.session->uid); u != per_uid_.end() && --u->second == 0) {
      per_uid_.erase(u);
    }
    listeners = listeners_;
    metrics_->SetSessions(static_cast<double>(sessions_.size()));
  }
  loop_->Remove(entry.pidfd.get());
  if (end.process_exited()) end.exit = ReadProcessExit(entry.pidfd.get(), entry.session->pid);
  metrics_->SessionReleased(end.reason);
  for (const EndListener& listener : listeners) listener(*entry.session, end);
  COMMD_LOG(INFO, "sessions") << "session closed (" << end.reason
                              << (end.process_exited() ? ": " + end.exit.ToString() : "")
                              << "): job " << entry.session->job_id << " pid "
                              << entry.session->pid;
  return true;
}

void SessionRegistry::CloseForDisconnect(absl::string_view token) {
  bool exited = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(std::string(token));
    if (it == sessions_.end()) return;
    pollfd p{it->second.pidfd.get(), POLLIN, 0};
    exited = ::poll(&p, 1, 0) == 1;  // a pidfd turns readable when its process exits
  }
  if (exited) {
    End(token, {.reason = "process_exited"});
    return;
  }
  // If the process is on its way out, its pidfd closes the session as "process_exited"
  // within this delay and the timer finds nothing left to close.
  timers_->Schedule(absl::Now() + kExitSettleTime,
                    [this, t = std::string(token)] { End(t, {.reason = "closed"}); });
}

void SessionRegistry::OnProcessExit(const std::string& token) {
  End(token, {.reason = "process_exited"});
}

size_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace commd::server
