#include "daemon/watchdog/rank_signals.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/time/clock.h"
#include "common/log.h"

namespace commd::watchdog {

namespace {

int PidfdOpen(int64_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSignal(int fd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0));
}

}  // namespace

RankSignals::RankSignals(PushEvent push, RecorderClock* clock, GroupMetrics* metrics,
                         absl::Duration terminate_grace)
    : push_(std::move(push)), clock_(clock), metrics_(metrics), terminate_grace_(terminate_grace) {}

int RankSignals::Notify(const groups::GroupSnapshot& g, AbortReason reason, const std::string& text,
                        bool* first_out) {
  const uint64_t now = clock_->NowNs();
  int notified = 0;
  bool first = false;
  {
    // Every rank's word before any rank hears of the abort, one abort's words at a time: a
    // rank that answers this abort with one of its own (a failed exchange between nodes) or
    // an abort from another source at the same moment finds every word written, so that
    // every rank reads the same first reason.
    absl::MutexLock lock(&words_mu_);
    for (const groups::MemberSnapshot& m : g.members) {
      if (m.block == nullptr) continue;
      first = RequestAbort(m.block->data(), m.block->size(), reason, text, now) || first;
    }
  }
  for (const groups::MemberSnapshot& m : g.members) {
    if (m.block == nullptr || m.gone) continue;
    v1::SessionEvent event;
    event.mutable_abort_requested()->set_group(g.name);
    event.mutable_abort_requested()->set_reason(text);
    if (push_) push_(m.session_token, event);
    ++notified;
  }
  if (first_out != nullptr) *first_out = first;
  if (first) {
    metrics_->CountAbort(g.job_id, g.name, AbortReasonName(static_cast<uint32_t>(reason)));
  }
  COMMD_LOG(WARNING, "watchdog") << g.job_id << "/" << g.name << ": abort ("
                                 << AbortReasonName(static_cast<uint32_t>(reason)) << ") sent to "
                                 << notified << " rank(s): " << text;
  return notified;
}

void RankSignals::Terminate(const groups::GroupSnapshot& g) {
  const absl::Time kill_at = absl::Now() + terminate_grace_;
  absl::MutexLock lock(&mu_);
  for (const groups::MemberSnapshot& m : g.members) {
    if (m.gone || m.pid <= 0) continue;
    UniqueFd fd(PidfdOpen(m.pid));
    if (fd.get() < 0) continue;  // already gone
    if (PidfdSignal(fd.get(), SIGTERM) != 0 && errno == ESRCH) continue;
    COMMD_LOG(WARNING, "watchdog")
        << g.job_id << "/" << g.name << ": SIGTERM to rank " << m.rank << " (pid " << m.pid << ")";
    kills_.push_back({std::move(fd), kill_at});
  }
}

void RankSignals::KillDue(absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (auto it = kills_.begin(); it != kills_.end();) {
    if (it->at > now) {
      ++it;
      continue;
    }
    PidfdSignal(it->pidfd.get(), SIGKILL);  // ESRCH: it went on its own
    it = kills_.erase(it);
  }
}

}  // namespace commd::watchdog
