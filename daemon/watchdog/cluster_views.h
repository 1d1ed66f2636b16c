// Every node's view of a job's groups, with a cluster (docs/cluster.md, "Every node's view of
// the job"): the watchdog publishes each group's view on change, at most once a second, and
// `commctl health --cluster` reads every node's. The cluster implements it
// (daemon/cluster/progress.h); without a cluster there is none.
#ifndef COMMD_DAEMON_WATCHDOG_CLUSTER_VIEWS_H_
#define COMMD_DAEMON_WATCHDOG_CLUSTER_VIEWS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "commd/v1/health.pb.h"

namespace commd::watchdog {

class ClusterViews {
 public:
  using ReadDone = std::function<void(absl::StatusOr<std::vector<v1::NodeGroupView>>)>;

  virtual ~ClusterViews() = default;
  // The group's view changed (state, progress, diagnosis); `view.node` is filled here. Never
  // blocks (the watchdog's thread calls it).
  virtual void Publish(v1::NodeGroupView view) = 0;
  // The group is gone from this node. Never blocks.
  virtual void Remove(uint32_t uid, const std::string& job_id, const std::string& group) = 0;
  // Every node's views of job `job_id` of `uid` (nullopt: of any uid, for admins), `group`
  // empty: every group; by group, then node. `done` runs once, on any thread. Never blocks.
  virtual void Read(std::optional<uint32_t> uid, const std::string& job_id,
                    const std::string& group, ReadDone done) = 0;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_CLUSTER_VIEWS_H_
