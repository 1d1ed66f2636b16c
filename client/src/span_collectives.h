// Internal to the SDK: the collectives of a host group that spans nodes (docs/cluster.md,
// "Collectives across nodes").
//
// Each node's ranks meet over their symmetric memory and one rank per node, the leader (local
// rank 0), exchanges the node's part with the other nodes' leaders over gloo's TCP transport:
//
//   every rank   stages its input in its region of the call's buffer (the host-memory
//                overloads copy it into the staging buffer; NaN/Inf counted on the way) and
//                writes its call's signature and count to its words (span_agreement.h); local
//                barrier
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
// The words, the leaders' agreement, the gloo meshes and the abort are the group's
// SpanAgreement's (span_agreement.h), which this backend holds; the data between the nodes are
// SpanExchange's (span_exchange.h). A failed exchange between nodes fails the call on every
// rank of the node, asks the daemon to abort the group (so every node learns of it) and fails
// every later call of the group.
#ifndef COMMD_CLIENT_SRC_SPAN_COLLECTIVES_H_
#define COMMD_CLIENT_SRC_SPAN_COLLECTIVES_H_

#include <functional>
#include <memory>

#include "client/src/collective_call.h"
#include "client/src/span_agreement.h"

namespace commd {

// A spanning group's collectives, as the group holds them (host here; CUDA:
// cuda_collectives.h).
struct SpanCollectives {
  // Runs the group's collectives; null for a CUDA group in an SDK built without CUDA.
  std::unique_ptr<CollectiveBackend> backend;
  // Ends the rank's waits on other nodes at once (its gloo connections; on CUDA memory also its
  // NCCL communicator): a rank blocked on a peer node returns with an error. The client's event
  // thread calls it when the group is aborted, while a collective may run. Borrows from
  // `backend`: called only while it lives.
  std::function<void()> close;
};

// The collectives of a host group spanning nodes (this file's protocol).
SpanCollectives MakeHostSpanCollectives(SpanSetup setup);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_SPAN_COLLECTIVES_H_
