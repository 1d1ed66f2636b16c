// The watchdog: every poll_interval it reads each group's control blocks (shared memory
// only), classifies what it sees (classifier.h) and applies the group's policy to a finding.
// A rank's death (OnRankDeath, from the group registry the moment its pidfd fires) is not a
// suspicion but a fact: it aborts the group as NOTIFY does under every policy, with one dump
// (trigger rank_death), and TERMINATE still ends the survivors. The policies for findings:
//   REPORT     log, metrics, and a flight-recorder dump of every rank with the diagnosis inside;
//   NOTIFY     also set the abort word in every rank's control block (which wakes futex
//              waiters) and send an abort event on each rank's Attach stream;
//   TERMINATE  also SIGTERM the group's live ranks, and SIGKILL them after terminate_grace.
//
//   Watchdog dog(options, groups, group_dumps, push_event, &registry, NewRealtimeRecorderClock());
//   dog.Start();                       // its own thread
//   auto health = dog.Health(filter);  // GetHealth
//   dog.Abort(target, "admin says so");
//
// It never calls into a client, never waits on CUDA, never holds a lock a client could hold:
// reads are bounded seqlocked copies, dumps are queued on the dumper's thread, events are
// queued on the session's stream, signals go through pidfds. What it learns per group (state,
// progress, durations, findings) goes to GroupMetrics, which serves every per-group series.
// Its parts: each rank's ring cursor (ring_cursor.h), the signals to ranks (rank_signals.h),
// and here the poll over the registry's snapshot, the policies and the health report.
//
// Thread-safety: every public method is thread-safe.
#ifndef COMMD_DAEMON_WATCHDOG_WATCHDOG_H_
#define COMMD_DAEMON_WATCHDOG_WATCHDOG_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/health.pb.h"
#include "commd/v1/session.pb.h"
#include "common/control_block_clock.h"
#include "daemon/groups/group_registry.h"
#include "daemon/recorder/group_dumps.h"
#include "daemon/recorder/ring_reader.h"
#include "daemon/watchdog/abort_announcer.h"
#include "daemon/watchdog/classifier.h"
#include "daemon/watchdog/cluster_views.h"
#include "daemon/watchdog/group_metrics.h"
#include "daemon/watchdog/rank_signals.h"
#include "daemon/watchdog/ring_cursor.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace commd::watchdog {

struct WatchdogOptions {
  absl::Duration poll_interval = absl::Milliseconds(100);
  absl::Duration heartbeat_timeout = absl::Seconds(60);
  absl::Duration max_timeout = absl::Hours(1);  // caps each group's collective timeout
  v1::WatchdogPolicy policy = v1::REPORT;       // for groups that do not choose
  absl::Duration terminate_grace = absl::Seconds(5);
  // Each group's view goes here on change, at most once per progress_period (null: nowhere).
  ClusterViews* progress = nullptr;
  absl::Duration progress_period = absl::Seconds(1);
  // Where an abort of a formed group spanning nodes is announced to its other nodes (null:
  // nowhere; docs/cluster.md, "An abort across nodes").
  AbortAnnouncer* aborts = nullptr;
  // A finding on a group spanning nodes reads every node's view of the group from `progress`
  // for its job-wide sentence (Diagnosis.job_summary); its log line, dump and abort wait for
  // the answer at most this long, then go ahead with this node's diagnosis alone (docs/
  // cluster.md, "The watchdog's job-wide sentence"). Short enough that the job's dump still
  // lands on every node within a second of the finding.
  absl::Duration job_view_wait = absl::Milliseconds(300);
};

class Watchdog {
 public:
  // `groups`, `dumps` and `registry` must outlive the watchdog; so must `options.progress`,
  // whose reads must all have answered before the watchdog is destroyed (the daemon stops the
  // cluster's etcd client first).
  Watchdog(WatchdogOptions options, groups::GroupRegistry* groups, recorder::GroupDumps* dumps,
           PushEvent push, prometheus::Registry* registry, std::unique_ptr<RecorderClock> clock);
  ~Watchdog();  // stops the thread

  // Starts polling on the watchdog's own thread.
  void Start();
  // Stops the thread; findings still waiting for the nodes' views go ahead without them.
  void Stop();

  // One poll of every group (the thread calls it; tests and benchmarks may too).
  void PollOnce();

  // Current health of the groups `filter` selects.
  std::vector<v1::GroupHealth> Health(const groups::GroupSelector& filter) const;

  // Sets the abort word of every rank of the selected groups (kAdmin) and sends each an abort
  // event; returns the ranks notified. NOT_FOUND when no group matches.
  absl::StatusOr<int> Abort(const groups::GroupSelector& filter, const std::string& reason);

  // The per-group series ({job, group}); the daemon serves it on /metrics.
  std::shared_ptr<prometheus::Collectable> group_metrics() const { return group_metrics_; }

  // The registry's hook: a member's process exited. Aborts the group's collectives on every
  // surviving rank (abort word and event) and queues one dump; never blocks. A death in a
  // group already aborted is only logged: what stopped the group has its finding and dump.
  void OnRankDeath(const groups::RankDeath& death);

  // The cluster's hook: node `node`'s daemon is gone (its lease in etcd expired or was
  // revoked), as etcd's revision `revision` says. Every formed group spanning that node is
  // aborted on this node's ranks under every policy, as for a rank's death, naming the node and
  // its global ranks, with one dump (trigger node_lost) under an id every node derives alike
  // from the node and the revision, so the nodes' dumps of it meet without announcing it
  // (which every node would). Never blocks.
  void OnNodeGone(const std::string& node, int64_t revision);

  // The cluster's hook: node `notice.node` aborted its ranks of a spanning group. This node's
  // ranks of the same formation (uid, job, group, formation alike) are aborted with the text
  // "aborted on node <node>: <its text>" and the same reason, without a dump (the announcing
  // node's abort dump is a job dump every node writes) and without announcing it again. A group
  // already aborted here keeps its own cause; another formation is untouched. Returns the number
  // of groups aborted (0 or 1). Never blocks.
  int OnRemoteAbort(const SpanAbortNotice& notice);

  // The cluster's hook: this daemon's own lease in etcd is gone (`why` says how), so the other
  // nodes count this node as gone and abort their parts of every group spanning it. This node's
  // ranks of every formed spanning group are aborted too, under every policy, naming the cause,
  // with a local dump (trigger lease_lost) and no announcement. Never blocks.
  void OnLeaseLost(const std::string& why);

  // The registry's hook: a rendezvous timed out.
  void OnRendezvousTimeout(const groups::GroupSnapshot& group, const std::vector<int>& joined,
                           const std::vector<int>& missing);

 private:
  struct Tracked {
    groups::GroupSnapshot info;
    GroupTracker tracker;
    std::vector<RankCursor> ranks;
    v1::GroupHealthState state = v1::HEALTHY;
    std::optional<v1::Diagnosis> last;
    std::string acted_key;  // the finding already acted upon
    std::string abort_reason;
    std::string aborted_on_node;  // aborted by another node's announcement
    bool retired = false;
    std::string published;  // what the last view published said (ProgressKey)
    uint64_t published_ns = 0;
    uint32_t job_view_gen = 0;  // bumped when `last` gains its job-wide sentence
  };
  using Deferred = std::vector<std::function<void()>>;

  void Run();
  void ReadRank(const groups::MemberSnapshot& m, RankCursor& cursor, uint64_t now_ns,
                const groups::GroupSnapshot& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollGroup(Tracked& t, uint64_t now_ns, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a finding comes from when it is not the poll's: acted on under every policy.
  struct Cause {
    const groups::RankDeath* death = nullptr;  // a rank's death: the group dumped as it was
    const char* trigger = nullptr;             // a fact of the cluster (node_lost, lease_lost)
    recorder::DumpHow dump;                    // how its dump is written
    // Tell the group's other nodes (not for a fact of the cluster: every node sees it).
    bool announce = true;
  };
  void Act(Tracked& t, const v1::Diagnosis& d, Deferred& deferred, const Cause& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a finding does once decided, outside mu_: the log line, the dump, and when it aborts,
  // the abort word and events, its announcement, and under TERMINATE the signals.
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
  void Carry(const Finding& f);
  // A finding on a spanning group waiting for every node's view of the group.
  struct JobViewWait {
    Finding finding;
    std::string acted_key;  // the finding whose health and view get the sentence
    v1::NodeGroupView local;
    absl::Time deadline;
  };
  // Reads the nodes' views for `f` (a deferred read) or, when the group already waits or its uid
  // has kMaxJobViewWaitsPerUid waiting, carries `f` out now saying why there is no sentence.
  void WaitForJobView(Tracked& t, Finding f, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The views came (or `views` says why not): the sentence goes into the finding, the group's
  // health and next published view, then the finding is carried out. Once per wait.
  void FinishJobView(uint64_t wait, absl::StatusOr<std::vector<v1::NodeGroupView>> views);
  // Finishes the waits whose deadline is at or before `now` without the views.
  void ExpireJobViews(absl::Time now);
  absl::Time NextJobViewDeadline() const;
  void SetJobSummary(uint64_t group_id, const std::string& acted_key, const std::string& summary)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // options_.aborts hears of `g`'s abort when `g` is a formed group spanning nodes.
  void Announce(const groups::GroupSnapshot& g, AbortReason reason, const std::string& text);
  // The entry of `g`, made now if the poll has not seen it yet.
  Tracked& Track(const groups::GroupSnapshot& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishMetrics(const Tracked& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::GroupHealth HealthOf(const Tracked& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the group's view to options_.progress when it changed and the period has passed.
  void PublishProgress(Tracked& t, uint64_t now_ns, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(Tracked& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration TimeoutOf(const groups::GroupSnapshot& g) const;
  v1::WatchdogPolicy PolicyOf(const groups::GroupSnapshot& g) const;

  const WatchdogOptions options_;
  groups::GroupRegistry* const groups_;
  recorder::GroupDumps* const dumps_;
  std::unique_ptr<RecorderClock> clock_;

  const std::shared_ptr<GroupMetrics> group_metrics_ = std::make_shared<GroupMetrics>();
  RankSignals signals_;
  prometheus::Histogram* poll_seconds_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Tracked> tracked_ ABSL_GUARDED_BY(mu_);        // by group id
  std::vector<Tracked> retired_ ABSL_GUARDED_BY(mu_);               // newest last, bounded
  std::map<uint64_t, JobViewWait> job_views_ ABSL_GUARDED_BY(mu_);  // by wait number
  uint64_t job_view_seq_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex run_mu_;
  bool stopping_ ABSL_GUARDED_BY(run_mu_) = false;
  std::thread thread_;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_WATCHDOG_H_
