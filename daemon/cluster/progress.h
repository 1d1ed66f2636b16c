// Every node's view of a job's groups, kept in etcd (docs/cluster.md, "Every node's view of the
// job"): the watchdog hands each group's view here on change, at most once a second, and it is
// written to <prefix>/progress/<uid>/<job>/<group>/<node> (a serialized v1::NodeGroupView) on
// the node's lease, so a node's views go with its daemon. Read returns every node's views of a
// job for `commctl health --cluster`.
//
//   ProgressBoard board(cluster, &registry);
//   watchdog_options.progress = &board;
//   HealthService health(rpc, watchdog, &board);
//
// While the cluster is disconnected, views are kept (the latest per group) and written when it
// connects again, on its new lease if the old one expired. Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_PROGRESS_H_
#define COMMD_DAEMON_CLUSTER_PROGRESS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster.h"
#include "daemon/watchdog/cluster_views.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace commd::cluster {

// The most views one Read returns (an etcd range's limit); more are left out and logged.
inline constexpr int64_t kMaxViewsRead = 4096;

// <prefix>/progress/<uid>/<job>/<group>/<node>, and back (nullopt for any other key). Group
// names may hold '/': the node is what follows the last one. Pure.
std::string ProgressKey(const std::string& prefix, uint32_t uid, const std::string& job,
                        const std::string& group, const std::string& node);
struct ProgressKeyParts {
  uint32_t uid = 0;
  std::string job, group, node;
};
std::optional<ProgressKeyParts> ParseProgressKey(const std::string& prefix, const std::string& key);

class ProgressBoard final : public watchdog::ClusterViews {
 public:
  // `cluster` must outlive this object, and its etcd client must be shut down (Cluster::Stop)
  // before this object goes: etcd's answers call back into it.
  ProgressBoard(Cluster* cluster, prometheus::Registry* registry);

  void Publish(v1::NodeGroupView view) override;
  void Remove(uint32_t uid, const std::string& job_id, const std::string& group) override;
  void Read(std::optional<uint32_t> uid, const std::string& job_id, const std::string& group,
            ReadDone done) override;

 private:
  using GroupKey = std::tuple<uint32_t, std::string, std::string>;  // uid, job, group
  // Writes `value` at `key` on the node's current lease (no-op while disconnected: the view
  // is written when the cluster is connected again).
  void Write(const std::string& key, const std::string& value);
  void RepublishAll();

  Cluster* const cluster_;
  prometheus::Counter* writes_;
  prometheus::Counter* write_failures_;
  absl::Mutex mu_;
  std::map<GroupKey, v1::NodeGroupView> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_PROGRESS_H_
