// What the cluster's events mean for this node's groups that span nodes, handed to the
// watchdog: another node's daemon gone (its lease in etcd ended), this daemon's own lease gone,
// and another node's abort of a group (docs/cluster.md, "Groups that span nodes" and "An abort
// across nodes"). A node or lease lost is a fact the watchdog acts on under every policy
// (Watchdog::ActOnFacts); another node's abort aborts this node's ranks of the same formation
// (Watchdog::AbortForNode). The daemon wires the cluster's watches to it.
//
//   ClusterEvents events(&watchdog, &registry);
//   span_aborts.Watch([&](const SpanAbortNotice& a) { return events.OnRemoteAbort(a); });
//
// Thread-safe; never blocks (the watchdog's hooks never do).
#ifndef COMMD_DAEMON_WATCHDOG_CLUSTER_EVENTS_H_
#define COMMD_DAEMON_WATCHDOG_CLUSTER_EVENTS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "daemon/groups/group_registry.h"
#include "daemon/watchdog/abort_announcer.h"
#include "daemon/watchdog/watchdog.h"

namespace commd::watchdog {

// The fact on `g` when node `node` is gone, as etcd's revision `revision` says (`why`: how,
// in words): nullopt unless `g` is a formed group with a part on that node. Its dump id is one
// every node derives alike from the node and the revision, so that the nodes' dumps of it meet
// without announcing it (which every node would). Pure.
std::optional<ClusterFact> NodeGoneFact(const groups::GroupSnapshot& g, const std::string& node,
                                        int64_t revision, absl::string_view why);

// The fact on `g` when this daemon's own lease in etcd is gone (`why` says how), so that the
// other nodes count this node as gone: nullopt unless `g` is a formed group spanning nodes.
// Dumped on this node only. Pure.
std::optional<ClusterFact> LeaseLostFact(const groups::GroupSnapshot& g, const std::string& why);

// Whether `notice` is of `g`'s formation (uid, job, group and formation alike). Pure.
bool IsFormationOf(const groups::GroupSnapshot& g, const SpanAbortNotice& notice);
// What this node's ranks are told: "aborted on node <node>: <its text>". Pure.
std::string RemoteAbortText(const SpanAbortNotice& notice);

class ClusterEvents {
 public:
  // `watchdog` and `groups` must outlive this object.
  ClusterEvents(Watchdog* watchdog, const groups::GroupRegistry* groups)
      : watchdog_(watchdog), groups_(groups) {}

  // Node `node`'s daemon is gone, as etcd's revision `revision` says (`why`: how): every
  // formed group spanning it is aborted on this node's ranks (NodeGoneFact).
  void OnNodeGone(const std::string& node, int64_t revision, absl::string_view why);

  // This daemon's own lease in etcd is gone: this node's ranks of every formed spanning group
  // are aborted too, naming the cause (LeaseLostFact), with no announcement.
  void OnLeaseLost(const std::string& why);

  // Node `notice.node` aborted its ranks of a spanning group: this node's ranks of the same
  // formation are aborted with the same reason, without a dump (the announcing node's abort
  // dump is a job dump every node writes) and without announcing it again. A group already
  // aborted here keeps its own cause; another formation is untouched. Returns the number of
  // groups aborted (0 or 1).
  int OnRemoteAbort(const SpanAbortNotice& notice);

 private:
  using FactOf = std::function<std::optional<ClusterFact>(const groups::GroupSnapshot&)>;
  // The facts `fact_of` finds in the registry's groups, handed to the watchdog at once.
  void ActOnFacts(const FactOf& fact_of);

  Watchdog* const watchdog_;
  const groups::GroupRegistry* const groups_;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_CLUSTER_EVENTS_H_
