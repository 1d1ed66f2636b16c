// What the watchdog does about a finding once it has one: the decision (DecideFinding: which
// trigger and dump, whether it aborts, announces, terminates) and the carrying out (Findings:
// the log line, the dump, and when it aborts the abort word and events, the registry's abort,
// the announcement to the group's other nodes and under TERMINATE the signals). A finding on a
// group spanning nodes may first wait, bounded, for every node's view of the group, so that its
// log line, dump and abort carry the job-wide sentence (job_view.h; docs/cluster.md, "The
// watchdog's job-wide sentence").
//
//   Finding f = DecideFinding(group, diagnosis, policy, Cause{});
//   if (needs_job_view) refused = findings.WaitForJobView(f, key, deferred);
//   else deferred.push_back([&findings, f] { findings.Carry(f); });
//
// Thread-safety: Findings' methods are thread-safe and never block (dumps and events are
// queued, signals are one syscall each, reads of the nodes' views are asynchronous); Carry and
// the views' arrival run the finding on the calling thread, outside every lock of the caller's.
#ifndef COMMD_DAEMON_WATCHDOG_FINDINGS_H_
#define COMMD_DAEMON_WATCHDOG_FINDINGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/health.pb.h"
#include "common/control_block.h"
#include "daemon/groups/group_registry.h"
#include "daemon/recorder/group_dumps.h"
#include "daemon/watchdog/abort_announcer.h"
#include "daemon/watchdog/cluster_views.h"
#include "daemon/watchdog/rank_signals.h"

namespace commd::watchdog {

// Work done after the watchdog's lock is released.
using Deferred = std::vector<std::function<void()>>;

// The finding kind as labels and dump triggers name it: "stuck", "lagging", ...
const char* KindLabel(v1::DiagnosisKind kind);
// The abort reason a finding of `kind` gives the ranks.
AbortReason ReasonOf(v1::DiagnosisKind kind);

// What a finding comes from when it is not the poll's: a fact, acted on under every policy.
struct Cause {
  const groups::RankDeath* death = nullptr;  // a rank's death: the group dumped as it was
  const char* trigger = nullptr;             // a fact of the cluster (node_lost, lease_lost)
  recorder::DumpHow dump;                    // how its dump is written
  // Tell the group's other nodes (not for a fact of the cluster: every node sees it).
  bool announce = true;
};
// A death, a node or a lease lost: certain, where the poll's findings are suspicions.
inline bool IsFact(const Cause& cause) {
  return cause.death != nullptr || cause.trigger != nullptr;
}

// A finding as decided, carried out outside the watchdog's lock.
struct Finding {
  groups::GroupSnapshot group;  // as the finding saw it
  bool dump_as_taken = false;   // dump `group` as taken (its blocks stay mapped), not as it is
  v1::Diagnosis d;
  v1::WatchdogPolicy policy = v1::REPORT;
  std::string trigger;
  recorder::DumpHow how;
  bool abort = false;
  bool announce = true;
  bool terminate = false;
};

// What finding `d` on `g` does under the group's `policy`, given its cause (Cause{} for the
// poll's). A fact aborts under every policy: the survivors can never complete with a dead rank
// or node, and waiting out their timeout would only hide what happened. Pure.
Finding DecideFinding(const groups::GroupSnapshot& g, const v1::Diagnosis& d,
                      v1::WatchdogPolicy policy, const Cause& cause);

struct FindingsOptions {
  ClusterViews* views = nullptr;     // every node's view of a group (null: no cluster)
  AbortAnnouncer* aborts = nullptr;  // the group's other nodes hear of its aborts (null: none)
  absl::Duration job_view_wait = absl::Milliseconds(300);
};

class Findings {
 public:
  // The sentence of a finding that waited for the nodes' views, for the watchdog's health of
  // group `group_id` when that still shows the finding `acted_key`. Called without any lock of
  // this object, on the thread that finishes the wait.
  using JobSummarySink = std::function<void(uint64_t group_id, const std::string& acted_key,
                                            const std::string& summary)>;

  // `groups`, `dumps`, `signals` and the options' pointers must outlive this object.
  Findings(FindingsOptions options, groups::GroupRegistry* groups, recorder::GroupDumps* dumps,
           RankSignals* signals, JobSummarySink job_summary);

  // Carries `f` out now.
  void Carry(const Finding& f);

  // Queues on `deferred` the read of every node's view of `f`'s group; `f` is carried out once
  // the views come or the wait ends (ExpireJobViews), with its job-wide sentence. When the
  // group already waits, or its uid has kMaxJobViewWaitsPerUid waiting, `f` is carried out at
  // once (queued on `deferred`) saying why it has no sentence, and that sentence is returned.
  std::optional<std::string> WaitForJobView(Finding f, const std::string& acted_key,
                                            Deferred& deferred);
  // Finishes the waits whose deadline is at or before `now` without the views.
  void ExpireJobViews(absl::Time now);
  // The earliest deadline of a wait (InfiniteFuture: none waits).
  absl::Time NextJobViewDeadline() const;

  // options.aborts hears of `g`'s abort when `g` is a formed group spanning nodes.
  void Announce(const groups::GroupSnapshot& g, AbortReason reason, const std::string& text);

 private:
  struct JobViewWait {
    Finding finding;
    std::string acted_key;  // the finding whose health and view get the sentence
    v1::NodeGroupView local;
    absl::Time deadline;
  };
  // The views came (or `views` says why not): the sentence goes into the finding and the
  // watchdog's health of it, then the finding is carried out. Once per wait.
  void FinishJobView(uint64_t wait, absl::StatusOr<std::vector<v1::NodeGroupView>> views);

  const FindingsOptions options_;
  groups::GroupRegistry* const groups_;
  recorder::GroupDumps* const dumps_;
  RankSignals* const signals_;
  const JobSummarySink job_summary_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, JobViewWait> job_views_ ABSL_GUARDED_BY(mu_);  // by wait number
  uint64_t job_view_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_FINDINGS_H_
