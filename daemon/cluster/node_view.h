// This daemon's view of the cluster's nodes: the keys under <prefix>/nodes/ as its watch and
// its reads of etcd found them, live or gone, and the answer to ListClusterNodes from it. Plain
// data: NodeDirectory feeds it from etcd; nothing here calls etcd or blocks.
//
//   NodeView view({}, "node-a");
//   view.Put("node-b", R"({"owner":"h:/run/commd","pid":7,"lease_ttl_s":10})", lease, rev, now);
//   view.Delete("node-b", rev + 1, now);               // gone: listed for an hour
//   ASSIGN_OR_RETURN(v1::ListClusterNodesResponse r, view.List(request, self_lease, now));
//
// Changes are ordered by etcd revision: an older one than what the view holds for a node is
// ignored, so a read and a watch whose answers cross leave the newer state. What it holds is
// bounded: at most max_live live nodes and max_gone gone ones (the oldest go first, and any
// after gone_kept), a value parsed only up to kMaxValueBytes and its strings cut, and a key
// that names no node rejected. Not thread-safe: NodeDirectory holds a lock around it.
#ifndef COMMD_DAEMON_CLUSTER_NODE_VIEW_H_
#define COMMD_DAEMON_CLUSTER_NODE_VIEW_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/v1/node.pb.h"
#include "daemon/cluster/cluster.h"

namespace commd::cluster {

struct NodeViewLimits {
  size_t max_live = 16384;  // live nodes kept; past it, the view says it is incomplete
  size_t max_gone = 1024;   // gone nodes kept
  absl::Duration gone_kept = absl::Hours(1);
};

// One key of <prefix>/nodes/ as a read of etcd returned it.
struct NodeKeyValue {
  std::string name;  // the key past the prefix
  std::string value;
  int64_t lease = 0;
  int64_t mod_revision = 0;
};

class NodeView {
 public:
  static constexpr uint32_t kMaxAnswer = 1000;    // nodes per ListClusterNodes answer
  static constexpr size_t kMaxValueBytes = 4096;  // a longer value is not parsed
  static constexpr size_t kMaxFieldBytes = 256;   // each string of a value, cut past it

  NodeView(NodeViewLimits limits, std::string this_node)
      : limits_(limits), this_node_(std::move(this_node)) {}

  // Key `name` written at `revision` (a watch's PUT event). False when it names no node.
  // `replaced` (optional) is set when the write ended a live registration: the node's key was
  // taken over on another lease (its daemon restarted within its lease's TTL, or came back
  // after losing its lease while this view missed the deletion), so whatever the old
  // registration held is gone as surely as if the key had been deleted.
  bool Put(const std::string& name, const std::string& value, int64_t lease, int64_t revision,
           absl::Time now, bool* replaced = nullptr);
  // Key `name` deleted at `revision` (its lease ended, or an operator deleted it). True when
  // the view held it live until now.
  bool Delete(const std::string& name, int64_t revision, absl::Time now);
  // A read of every key at `revision`: keys it lacks that the view holds live from before
  // `revision` are gone (their deletion was not seen: etcd compacted it away). `complete` false:
  // the read stopped at its limit (more keys exist). Returns the nodes whose registration
  // ended (gone, or replaced as Put says), in name order.
  std::vector<std::string> Reconcile(const std::vector<NodeKeyValue>& kvs, int64_t revision,
                                     bool complete, absl::Time now);
  // The watch opened or ended: the view follows etcd, or is the last one seen.
  void SetWatching(bool watching, absl::Time now);

  // One page of nodes, by name, after request.start_after. `self` is this node's lease as the
  // cluster knows it (its remaining time). INVALID_ARGUMENT naming the value and its range for
  // a limit over kMaxAnswer or a start_after that names no node.
  absl::StatusOr<v1::ListClusterNodesResponse> List(const v1::ListClusterNodesRequest& request,
                                                    const LeaseState& self, absl::Time now);

  size_t live() const { return live_; }

 private:
  struct Entry {
    v1::ClusterNode node;  // name, live, lease, the value's fields, since, revision
  };
  // Drops gone entries past gone_kept and past max_gone (the oldest first).
  void Prune(absl::Time now);
  // Fills `node` from `value` (JSON written by commd: owner, pid, version, metrics, lease_ttl_s).
  static void ParseValue(const std::string& value, v1::ClusterNode* node);

  const NodeViewLimits limits_;
  const std::string this_node_;
  std::map<std::string, Entry> nodes_;
  size_t live_ = 0;
  bool incomplete_ = false;
  bool watching_ = false;
  // Keys that name no node: in the last read of etcd, plus such writes the watch saw since.
  uint32_t rejected_ = 0;
  int64_t revision_ = 0;
  absl::Time changed_ = absl::InfinitePast();
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_NODE_VIEW_H_
