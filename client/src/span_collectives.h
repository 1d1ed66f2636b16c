// Internal to the SDK: the collectives of a host group that spans nodes (docs/cluster.md,
// "Collectives across nodes").
//
// Each node's ranks meet over their symmetric memory and one rank per node, the leader (local
// rank 0), exchanges the node's part with the other nodes' leaders over gloo's TCP transport:
//
//   every rank   stages its input in its region of the call's buffer (the host-memory
//                overloads copy it into the staging buffer; NaN/Inf counted on the way) and
//                writes its call's signature and count to its words (below); local barrier
//   the leader   agrees with the other leaders: one gloo all-gatherv of a slot per node whose
//                size depends on the layout only, holding the node's range of signatures and
//                NaN/Inf counts (a call that differs on any rank of any node fails everywhere
//                here, before data move, whatever each rank called); a small all-reduce (up to
//                4 KiB) rides in the slot and is reduced in node order on every node, done in
//                this one exchange. Else the data exchange (gloo all-reduce, broadcast,
//                all-gatherv or all-to-allv) from and into the node's regions. The outcome
//                (status, the group-wide NaN finding, whether lanes follow) into its words;
//                local barrier
//   every rank   reads the outcome from the leader's words; the host-memory overloads copy
//                the result out of the staging buffer
//
// A large all-reduce (4 MiB and more) on nodes with equal numbers of ranks runs in lanes
// after the agreement: local rank l of every node reduces the node's slice l into its own
// region, all-reduces it with rank l of the other nodes over its own gloo connections
// (lane 0 is the leaders') and, unless the call is staged, writes it straight into every local
// rank's output while it is in cache; a barrier. A staged call's ranks then copy every slice
// from its owner's region into their own output, and pass a closing barrier. Every rank and
// connection then works on 1/local of the data at once (docs/PERFORMANCE.md, "Collectives across
// nodes"). The leader decides and every local rank follows its word, so a node's ranks always pass
// the same barriers.
//
// The words are a small symmetric buffer of the group's (SpanWords per rank), allocated on the
// group's first collective. Each lane's gloo full mesh is made on its first exchange, its
// addresses exchanged through the job's store (the cluster's: the same on every node) under
// "commd.span/<group>/<formation>/<local rank>/", keys deleted once every peer is connected.
// An abort of the group (any node's, through the daemon) fails the rank's gloo connections,
// so a rank blocked on a peer node returns at once and its peers' waits on it fail too; a
// failed exchange between nodes fails the call on every rank of the node, asks the daemon to
// abort the group (so every node learns of it) and fails every later call of the group.
#ifndef COMMD_CLIENT_SRC_SPAN_COLLECTIVES_H_
#define COMMD_CLIENT_SRC_SPAN_COLLECTIVES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/src/collective_call.h"
#include "commd/group.h"
#include "commd/store.h"

namespace commd {

// One rank's words of the group's span words buffer (kSpanWordsBytes per rank).
inline constexpr size_t kSpanWordsBytes = 1024;

struct SpanSetup {
  std::string group;  // the group's name
  uint64_t formation = 0;
  int local_rank = 0;
  int local_world_size = 1;
  int global_world_size = 1;
  std::vector<NodeRanks> layout;  // sorted by node name, as the daemon answered
  int node_index = 0;
  Store* store = nullptr;       // the job's store, the same on every node
  absl::Duration connect_wait;  // how long the leaders wait for each other to connect
  const uint32_t* abort_word = nullptr;
  uint64_t* heartbeat_ns = nullptr;
  // Asks the daemon to abort the group (best effort), with this reason.
  std::function<void(const std::string&)> request_abort;
};

class SpanBackend : public CollectiveBackend {
 public:
  virtual ~SpanBackend() = default;
  // Ends the leader's connections to the other nodes: a leader blocked on a peer node returns
  // with an error. Called from the client's event thread when the group is aborted.
  virtual void Close() = 0;
  // The agreement alone (the host backend's; the CUDA backend runs it through one before it
  // enqueues anything): writes this rank's call signature to its words of c.span_words (host
  // memory), meets the node's ranks there and, through the leaders, every node's. OK when
  // every rank of every node made this call; INVALID_ARGUMENT on every rank when any differs;
  // ABORTED or a failure between the nodes as for a collective (every later call then fails
  // too). Blocks until every rank has called or the call's wait ends.
  virtual absl::Status Agree(const CheckedCall& c) = 0;
};

std::unique_ptr<SpanBackend> MakeSpanBackend(SpanSetup setup);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_SPAN_COLLECTIVES_H_
