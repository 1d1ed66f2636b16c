// How the watchdog reaches a group's ranks: the abort word in each control block plus an abort
// event on each rank's Attach stream (Notify), and SIGTERM then, after a grace, SIGKILL through
// pidfds (Terminate, KillDue), so a recycled pid is never signalled.
//
// Never blocks: events are queued on the session's stream, signals are one syscall each.
// Thread-safe.
#ifndef COMMD_DAEMON_WATCHDOG_RANK_SIGNALS_H_
#define COMMD_DAEMON_WATCHDOG_RANK_SIGNALS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/session.pb.h"
#include "common/control_block_admin.h"
#include "common/control_block_clock.h"
#include "common/unique_fd.h"
#include "daemon/groups/group_snapshot.h"
#include "daemon/watchdog/group_metrics.h"

namespace commd::watchdog {

// Sends an event on a session's Attach stream; false when the session is not attached.
using PushEvent = std::function<bool(const std::string& token, const v1::SessionEvent& event)>;

class RankSignals {
 public:
  // `clock` and `metrics` must outlive this object.
  RankSignals(PushEvent push, RecorderClock* clock, GroupMetrics* metrics,
              absl::Duration terminate_grace);

  // Sets the abort word of every rank's control block (the first abort of the group is counted
  // in commd_group_aborts_total), then sends each live rank an abort event; returns how many.
  // Concurrent calls write their words one after the other: the first reason is every rank's.
  // `*first` (optional) says whether this call set some rank's abort word, i.e. whether the
  // group had not been aborted before.
  int Notify(const groups::GroupSnapshot& g, AbortReason reason, const std::string& text,
             bool* first = nullptr);

  // SIGTERM to the group's live ranks; SIGKILL to those still there after terminate_grace.
  void Terminate(const groups::GroupSnapshot& g);
  // Sends the SIGKILLs whose grace has passed (the watchdog calls it every poll).
  void KillDue(absl::Time now);

 private:
  struct Kill {
    UniqueFd pidfd;
    absl::Time at;
  };
  const PushEvent push_;
  RecorderClock* const clock_;
  GroupMetrics* const metrics_;
  const absl::Duration terminate_grace_;
  absl::Mutex words_mu_;  // held while one Notify writes its abort words
  absl::Mutex mu_;
  std::vector<Kill> kills_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_RANK_SIGNALS_H_
