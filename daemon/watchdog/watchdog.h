// The watchdog: every poll_interval it reads each group's control blocks (shared memory
// only), classifies what it sees (classifier.h) and applies the group's policy to a finding.
// A rank's death (OnRankDeath, from the group registry the moment its pidfd fires) is not a
// suspicion but a fact: it aborts the group as NOTIFY does under every policy, with one dump
// (trigger rank_death), and TERMINATE still ends the survivors. So are the cluster's facts
// (ActOnFacts: a node or this node's lease lost, which cluster_events.h finds). The policies
// for findings:
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
// Its parts: each rank's ring cursor (ring_cursor.h), what a finding does once decided and the
// wait for the nodes' views (findings.h), the signals to ranks (rank_signals.h); here the poll
// over the registry's snapshot, what the watchdog knows of each group, and its health report.
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
#include "daemon/watchdog/findings.h"
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

// A fact of the cluster about one group (cluster_events.h finds them), acted on under every
// policy as a rank's death is: the group's ranks here are aborted, with one dump, and its other
// nodes are not told (every node sees the fact).
struct ClusterFact {
  groups::GroupSnapshot group;
  v1::Diagnosis diagnosis;        // kind DEAD and its summary; the watchdog stamps its times
  std::string key;                // the finding's key (health's acted finding)
  const char* trigger = nullptr;  // the dump's: node_lost, lease_lost
  recorder::DumpHow dump;
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

  // Acts on each fact on a group not aborted here yet. Never blocks.
  void ActOnFacts(std::vector<ClusterFact> facts);

  // Another node (`node`) aborted its ranks of `g`: this node's ranks are aborted with `reason`
  // and `text` (abort word and events, the registry's abort), without a dump or an
  // announcement. A group aborted here already keeps its own cause and is left as it is: false.
  // Never blocks.
  bool AbortForNode(const groups::GroupSnapshot& g, AbortReason reason, const std::string& text,
                    const std::string& node);

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

  void Run();
  void ReadRank(const groups::MemberSnapshot& m, RankCursor& cursor, uint64_t now_ns,
                const groups::GroupSnapshot& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads every rank of `t` (ranks sized to its members) into a view of the group; `*aborted`
  // says whether some rank's abort word is set.
  GroupView ReadGroup(Tracked& t, uint64_t now_ns, bool* aborted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollGroup(Tracked& t, uint64_t now_ns, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides what finding `d` on tracked group `t` does and has it carried out after the lock
  // (`deferred`), or first read every node's view of a spanning group.
  void Act(Tracked& t, const v1::Diagnosis& d, Deferred& deferred, const Cause& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The finding `acted_key` of group `group_id`, if health still shows it, gains its job-wide
  // sentence.
  void SetJobSummary(uint64_t group_id, const std::string& acted_key, const std::string& summary)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of `g`, now with this snapshot of it; made now when new (also a group that
  // formed since the last poll, which a rank's death or a fact may be the first to name).
  Tracked& Track(const groups::GroupSnapshot& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishMetrics(const Tracked& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::GroupHealth HealthOf(const Tracked& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the group's view to options_.progress when it changed and the period has passed.
  void PublishProgress(Tracked& t, uint64_t now_ns, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(Tracked& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `t` for health, the newest kRetiredKept at most.
  void Retire(Tracked t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration TimeoutOf(const groups::GroupSnapshot& g) const;
  v1::WatchdogPolicy PolicyOf(const groups::GroupSnapshot& g) const;

  const WatchdogOptions options_;
  groups::GroupRegistry* const groups_;
  recorder::GroupDumps* const dumps_;
  std::unique_ptr<RecorderClock> clock_;

  const std::shared_ptr<GroupMetrics> group_metrics_ = std::make_shared<GroupMetrics>();
  RankSignals signals_;
  Findings findings_;
  prometheus::Histogram* poll_seconds_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Tracked> tracked_ ABSL_GUARDED_BY(mu_);  // by group id
  std::vector<Tracked> retired_ ABSL_GUARDED_BY(mu_);         // newest last, bounded

  absl::Mutex run_mu_;
  bool stopping_ ABSL_GUARDED_BY(run_mu_) = false;
  std::thread thread_;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_WATCHDOG_H_
