// Every per-group Prometheus series of the daemon, labelled {job, group} (plus op, rank, state,
// kind or reason), computed here and nowhere else:
//   - counters the ranks keep in their control blocks (collectives by op, bytes, NaN checks
//     and hits, flight-recorder entries and drops), read at scrape time;
//   - what the watchdog derives from its polls (state, each rank's last progress, collective
//     durations) and its findings (hangs by kind, aborts by reason).
//
//   auto metrics = std::make_shared<GroupMetrics>();
//   exposer.RegisterCollectable(metrics);
//   metrics->Update(group_id, {.job = "j", .group = "tp", .state = v1::HEALTHY, ...});
//   metrics->CountHang("j", "tp", "stuck");
//   metrics->Retire(group_id);  // its gauges end; its counters keep their final values
//
// Lifetimes: the gauges of a group (state, last progress) end when the group retires. Its
// counters and histograms are kept per {job, group} with their final values, so a group that
// ends between two scrapes is still counted and a group formed again under the same name
// counts on from there (counters never go back); the kept values of the newest kIdleKept
// {job, group} pairs that no live group carries stay, older ones end. Groups of different
// uids with the same job id and name share their series: counters add up, the state is the
// worse one, a rank's progress the older one.
//
// Thread-safety: every method is thread-safe; Collect runs on the scraping thread and reads
// control blocks outside the lock.
#ifndef COMMD_DAEMON_WATCHDOG_GROUP_METRICS_H_
#define COMMD_DAEMON_WATCHDOG_GROUP_METRICS_H_

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "commd/v1/health.pb.h"
#include "common/control_block.h"
#include "common/shm_mapping.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace commd::watchdog {

class GroupMetrics final : public prometheus::Collectable {
 public:
  // {job, group} pairs no live group carries whose counters are still exported.
  static constexpr size_t kIdleKept = 64;

  struct Live {
    std::string job;
    std::string group;
    v1::GroupHealthState state = v1::HEALTHY;
    std::vector<std::shared_ptr<const SharedMapping>> blocks;  // by rank; null: not formed
    std::vector<uint64_t> progress_ns;  // by rank: when the daemon last saw it complete; 0: never
  };
  // One completed collective the watchdog saw: its op (CollectiveOp) and duration.
  struct Duration {
    uint32_t op = 0;
    double seconds = 0;
  };

  // The watchdog's view of live group `id` after a poll; replaces the previous one.
  void Update(uint64_t id, Live live);
  // A state change between polls (an admin abort); no-op for a group not live.
  void SetState(uint64_t id, v1::GroupHealthState state);
  // Group `id` is gone: reads its control blocks a last time and keeps their counters.
  void Retire(uint64_t id);

  void ObserveDurations(const std::string& job, const std::string& group,
                        absl::Span<const Duration> durations);
  void CountHang(const std::string& job, const std::string& group, const std::string& kind);
  void CountAbort(const std::string& job, const std::string& group, const std::string& reason);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  using Key = std::pair<std::string, std::string>;  // job, group
  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket of kDurationBounds, then +Inf; not cumulative
    double sum = 0;
    uint64_t count = 0;
  };
  // What the series of one {job, group} count.
  struct Counts {
    std::array<uint64_t, kRecordOpCount> per_op{};
    uint64_t bytes = 0, nan_checks = 0, nans_found = 0, entries = 0, dropped = 0;
    std::map<std::string, uint64_t> hangs;    // by kind
    std::map<std::string, uint64_t> aborts;   // by reason
    std::map<uint32_t, Histogram> durations;  // by op
  };

  static void AddBlocks(const Live& live, Counts* counts);
  Counts& KeptLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsLiveLocked(const Key& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkIdleLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, Live> live_ ABSL_GUARDED_BY(mu_);  // by group id
  // Retired groups' counters, and everything the watchdog counts, by {job, group}.
  std::map<Key, Counts> kept_ ABSL_GUARDED_BY(mu_);
  std::deque<Key> idle_ ABSL_GUARDED_BY(mu_);  // keys of kept_ no live group carries, oldest first
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_GROUP_METRICS_H_
