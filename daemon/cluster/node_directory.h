// The cluster's nodes as this daemon follows them in etcd (docs/cluster.md, "The nodes"): a
// list-then-watch of <prefix>/nodes/ (one read of those keys at first and after a compaction
// took changes the watch could not replay; PrefixWatch), kept in a NodeView. ListClusterNodes
// answers from that view, so a client's call costs etcd nothing. A node whose registration
// ends is handed to `on_gone` (the watchdog aborts the groups spanning it): its key deleted,
// found missing by a read, or taken over on a new lease (its daemon restarted within its
// lease's TTL: the ranks its earlier run held are watched by nobody).
//
//   NodeDirectory nodes(cluster, [&](const std::string& node, int64_t rev) { ... });
//   ASSIGN_OR_RETURN(v1::ListClusterNodesResponse page, nodes.List(request));
//
// What etcd costs: one watch stream, one range read at start and one after each compaction
// that cut the watch, none per reopening that etcd can replay, never one per call.
// Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_NODE_DIRECTORY_H_
#define COMMD_DAEMON_CLUSTER_NODE_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "commd/v1/node.pb.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/node_view.h"
#include "daemon/cluster/prefix_watch.h"

namespace commd::cluster {

class NodeDirectory {
 public:
  // `on_gone(node, revision, why)` hears every other node's registration end (on gRPC
  // threads), until Stop; `why` says how in words. `cluster` must outlive this object, and its etcd
  // client must be shut down (Cluster::Stop) before this object goes: a read's answer calls back
  // into it.
  using OnGone =
      std::function<void(const std::string& node, int64_t revision, absl::string_view why)>;
  NodeDirectory(Cluster* cluster, OnGone on_gone, NodeViewLimits limits = {});
  ~NodeDirectory();  // Stop()

  // Ends the watch; `on_gone` is not called afterwards. Idempotent.
  void Stop();

  // One page of the view (NodeView::List), this node's lease as the cluster knows it now.
  absl::StatusOr<v1::ListClusterNodesResponse> List(const v1::ListClusterNodesRequest& request);

 private:
  void OnEvent(const mvccpb::Event& e);
  void OnWatchState(bool open);
  // A read of every node key: the view reconciled with it.
  void OnList(const pb::RangeResponse& r);
  // Tells on_gone (unless stopped or it is this node).
  void Gone(const std::string& node, int64_t revision, absl::string_view why);

  Cluster* const cluster_;
  const std::string prefix_;  // "<prefix>/nodes/"
  const OnGone on_gone_;
  const NodeViewLimits limits_;
  absl::Mutex mu_;
  NodeView view_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<PrefixWatch> watch_;  // last: its callbacks use the members above
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_NODE_DIRECTORY_H_
