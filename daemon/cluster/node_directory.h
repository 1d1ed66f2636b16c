// The cluster's nodes as this daemon follows them in etcd (docs/cluster.md, "The nodes"): a
// watch of <prefix>/nodes/ and, each time the watch opens, one read of those keys to catch up
// on what it could not replay, kept in a NodeView. ListClusterNodes answers from that view, so
// a client's call costs etcd nothing; a node whose key goes is handed to `on_gone` (the
// watchdog aborts the groups spanning it).
//
//   NodeDirectory nodes(cluster, [&](const std::string& node, int64_t rev) { ... });
//   ASSIGN_OR_RETURN(v1::ListClusterNodesResponse page, nodes.List(request));
//
// What etcd costs: one watch stream, and one range read per opening of the watch (at start and
// after each outage), never one per call. Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_NODE_DIRECTORY_H_
#define COMMD_DAEMON_CLUSTER_NODE_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "commd/v1/node.pb.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/node_view.h"
#include "daemon/cluster/prefix_watch.h"

namespace commd::cluster {

class NodeDirectory {
 public:
  // `on_gone(node, revision)` hears every other node's key deleted (on gRPC threads), until
  // Stop. `cluster` must outlive this object, and its etcd client must be shut down
  // (Cluster::Stop) before this object goes: a read's answer calls back into it.
  NodeDirectory(Cluster* cluster,
                std::function<void(const std::string& node, int64_t revision)> on_gone,
                NodeViewLimits limits = {});
  ~NodeDirectory();  // Stop()

  // Ends the watch; `on_gone` is not called afterwards. Idempotent.
  void Stop();

  // One page of the view (NodeView::List), this node's lease as the cluster knows it now.
  absl::StatusOr<v1::ListClusterNodesResponse> List(const v1::ListClusterNodesRequest& request);

 private:
  void OnEvent(const mvccpb::Event& e);
  void OnWatchState(bool open);
  // Reads every node key (asynchronously) and reconciles the view with them.
  void Read();

  Cluster* const cluster_;
  const std::string prefix_;  // "<prefix>/nodes/"
  const std::function<void(const std::string&, int64_t)> on_gone_;
  const NodeViewLimits limits_;
  absl::Mutex mu_;
  NodeView view_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<PrefixWatch> watch_;  // last: its callbacks use the members above
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_NODE_DIRECTORY_H_
