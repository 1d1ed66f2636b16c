// The part of a group's rendezvous that happens between nodes: a group whose
// global_world_size exceeds its node-local world_size (docs/cluster.md, "Groups that span
// nodes"). The registry rendezvouses this node's ranks as for any group, then hands this
// node's part (the global rank of each local rank) to a SpanRendezvous, which meets the other
// nodes' parts and answers with the layout. The cluster's etcd is the one backend
// (daemon/cluster/span_rendezvous.h); tests may fake it.
//
//   ASSIGN_OR_RETURN(auto wait, span->Start(part, [](absl::StatusOr<v1::GroupLayout> r) { ... }));
//   ...
//   wait->Withdraw();  // the group failed, or its last local rank left: this node's part goes
#ifndef COMMD_DAEMON_GROUPS_SPAN_RENDEZVOUS_H_
#define COMMD_DAEMON_GROUPS_SPAN_RENDEZVOUS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/include/commd/limits.h"  // kMaxGlobalWorldSize
#include "commd/v1/groups.pb.h"

namespace commd::groups {

// This node's part of one spanning group.
struct SpanPart {
  uid_t uid = 0;
  std::string job;
  std::string group;
  int global_world_size = 0;
  std::vector<int> global_ranks;  // indexed by the node-local rank
};

// One node's part published and, until done, waited on.
class SpanWait {
 public:
  virtual ~SpanWait() = default;
  // The global ranks no node has claimed yet and the nodes seen, for a deadline's message:
  // "global rank(s) [2-3] never joined (nodes joined: n1 [0, 1])". Never blocks.
  virtual std::string Missing() const = 0;
  // Ends the wait (its `done` is not called after this returns) and deletes this node's part
  // from the cluster. Idempotent; never blocks (the delete is asynchronous).
  virtual void Withdraw() = 0;
};

class SpanRendezvous {
 public:
  virtual ~SpanRendezvous() = default;
  // OK when a spanning group could rendezvous now; else why not (UNAVAILABLE naming the
  // cluster's endpoint). Cheap; never blocks.
  virtual absl::Status Admit() const = 0;
  // Publishes `part` and watches for the other nodes' parts. `done` runs once, on any thread
  // (inside Start when etcd fails at once, so it must take no lock the caller holds): with the
  // layout when the parts cover every global rank exactly once, or the error (FAILED_PRECONDITION
  // for nodes that disagree, UNAVAILABLE when the cluster is lost) — unless Withdraw came first.
  // Refuses at once (nothing published) over the uid's share (limits.per_uid.spanning_groups) or
  // while disconnected. Never blocks.
  virtual absl::StatusOr<std::shared_ptr<SpanWait>> Start(
      SpanPart part, std::function<void(absl::StatusOr<v1::GroupLayout>)> done) = 0;
  // Ends every wait with UNAVAILABLE; later Starts fail. Called before the cluster stops.
  virtual void Shutdown() = 0;
};

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_SPAN_RENDEZVOUS_H_
