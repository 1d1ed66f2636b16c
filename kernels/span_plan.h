// What a rank of a group spanning nodes enqueues for one collective on CUDA memory
// (client/src/cuda_span_collectives.cc; docs/cluster.md "Collectives across nodes"): the
// node-local kernels of kernels/cuda over the node's symmetric memory and the NCCL calls
// between the nodes, as a pure function of the group's shape and the call, unit-tested on
// every build (kernels/span_plan_test.cc: every element reduced across every global rank
// exactly once, the same steps on every rank that must meet). Nothing here needs a CUDA
// header or a device.
//
//   SpanShape shape{.node_sizes = {4, 4}, .node = 1, .local_rank = 2};
//   ASSIGN_OR_RETURN(SpanPlan plan, PlanSpanAllReduce(shape, 0, n, DataType::kBFloat16,
//                                                     ReduceOp::kSum, kSpanLaneMinBytes));
//   for (const SpanStep& s : plan.steps) ...   // enqueue each on the call's stream
//
// The communicators: lane l joins local rank l of every node (its NCCL rank is the node's
// index in the layout). Lane 0 (the nodes' leaders) exists on every layout; lanes 1.. only
// when every node has as many ranks, since only then does every node have a rank l.
//
// All-reduce. Nodes of equal size with at least `lane_min_bytes` (and as many elements as
// local ranks) run in lanes: a node-local reduce-scatter of the first local*chunk elements
// (chunk = count / local) leaves local rank l the node's sum of chunk l in its scratch; lane l
// all-reduces it with the other nodes, out of place into chunk l of the rank's own region; then
// one node-local broadcast per chunk (root: the chunk's owner) hands every chunk to every local
// rank. (The node-local all-gather kernel cannot do this last step: its output must lie
// outside every data region, and here the result belongs in the region.) What is left, the
// count % local last elements (all of them for smaller calls and nodes of unequal size), goes
// through the leaders: a node-local all-reduce in place, lane 0's NCCL all-reduce in the
// leader's region, a node-local broadcast from the leader. kAvg sums within the node and asks
// NCCL for a sum of the inputs premultiplied by 1 / global world size (ncclRedOpCreatePreMulSum),
// so uneven nodes weigh every global rank alike; integers have no such scalar and are refused.
//
// NaN/Inf: the node-local kernels count this rank's input as they read it (reads_input). A
// node of one rank runs none of them, so its plans count the input with kCountNonFinite
// instead (before anything writes it); an all-to-all reads its input only through copies and
// NCCL, so every rank counts it with kCountNonFinite first.
//
// Broadcast: on the root's node a node-local broadcast from the root (so the leader holds the
// data), lane 0's NCCL broadcast from the root's node, then a node-local broadcast from the
// leader on every other node. Barrier: a node-local barrier, lane 0's all-reduce of one int32
// in the scratch, a node-local barrier.
//
// The collectives that place blocks by global rank (a node's global ranks may be any, in any
// order: SpanShape::global_ranks) go through the leaders; a block moves between nodes once.
// Runs of consecutive global ranks move as one block (one transfer for the usual layout).
//   All-gather: a node-local all-gather of the inputs into each rank's scratch (the node's
//   blocks in local order); the leader copies them to their global places in its output,
//   exchanges its node's blocks with every other leader in one NCCL group of sends and
//   receives (straight into their global places), then broadcasts its whole output to the node
//   (a node-local broadcast over the output buffer).
//   Reduce-scatter: the all-reduce above of all global_size * count input elements (lanes when
//   it is large and the nodes even), then each rank copies its own block to its output.
//   Between the nodes this moves up to twice what a reduce-scatter needs (an all-reduce is a
//   reduce-scatter and an all-gather), and reuses the all-reduce's checked paths and its lanes;
//   a direct exchange needs a node-local reduction of the received blocks that no kernel does.
//   All-to-all: this rank's NaN/Inf count of its whole input (kCountNonFinite); a node-local
//   barrier (every local input staged, every output free); each rank
//   copies its blocks for the node's ranks into their outputs (peer-mapped); the leader sends
//   every local rank's block for every rank of each other node, and receives every block for
//   its node's ranks straight into their outputs, in one NCCL group (NCCL reads and writes the
//   node's peer-mapped regions); a node-local barrier (the leader's NCCL work is done before
//   any rank reads its output or reuses its input).
#ifndef COMMD_KERNELS_SPAN_PLAN_H_
#define COMMD_KERNELS_SPAN_PLAN_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/types.h"

namespace commd::kernels {

// All-reduces from this size on nodes of equal size run in lanes (the host path's threshold,
// span_collectives.h).
inline constexpr size_t kSpanLaneMinBytes = size_t{4} << 20;

// The group as the plan sees it: how many local ranks each node has (in layout order), which
// node this is and this rank's local rank there.
// global_ranks[n][l] is the global rank of node n's local rank l; empty means global ranks in
// layout order (node 0's first). Only the collectives that place blocks by global rank read it.
struct SpanShape {
  std::vector<int> node_sizes;
  int node = 0;
  int local_rank = 0;
  std::vector<std::vector<int>> global_ranks;
};

// Which of this rank's buffers a step reads or writes: the call's input buffer's data region
// (the CUDA view's; in-place collectives have only this one), its output buffer's region
// (all-gather, reduce-scatter, all-to-all), or the device scratch outside every region.
enum class SpanBuffer { kIn, kOut, kScratch };

// One send or receive of a kNcclSendRecv group: `count` elements at byte `offset` of
// `buffer`, of this rank (owner -1) or of local rank `owner` of this node through its
// peer mapping, to or from the leader of node `peer` (its NCCL rank on lane 0).
struct SpanTransfer {
  bool send = false;
  int peer = -1;
  SpanBuffer buffer = SpanBuffer::kIn;
  int owner = -1;
  size_t offset = 0;
  size_t count = 0;
  bool operator==(const SpanTransfer&) const = default;
};

enum class SpanStepKind {
  kLocalBarrier,        // node-local barrier kernel
  kLocalAllReduce,      // in place on [offset, +count) of every local region (local_op)
  kLocalReduceScatter,  // [offset, +local*count) of every region -> this rank's scratch [0, count)
  kLocalBroadcast,      // [offset, +count) of local rank `root`'s region into every region, over
                        // the view of `buffer` (the input's or the output's)
  kNcclAllReduce,       // lane `lane`: from scratch [0, count) or region [offset, +count), into
                        // scratch [0, count) or region [offset, +count) (from_/to_scratch)
  kNcclBroadcast,       // lane `lane`, in place on region [offset, +count) from node `root`
  // Node-local all-gather kernel: [offset, +count) of every local input region -> this rank's
  // scratch [0, local*count), local rank p's elements at p*count.
  kLocalAllGather,
  // This rank alone (not a meeting; runs on nodes of one rank too): a stream-ordered device
  // copy of `count` elements from `src` of local rank `src_owner` (-1: this rank) at byte
  // `offset` to `dst` of `dst_owner` at byte `dst_offset`. A peer's buffer is touched only
  // between node-local meetings that order it (see each plan).
  kLocalCopy,
  // Lane `lane`: `transfers` in one ncclGroupStart/ncclGroupEnd, sends and receives to and
  // from each peer in this order (NCCL matches a pair's sends and receives in order; each
  // must have the other side's count and type).
  kNcclSendRecv,
  // This rank alone (not a meeting; runs on nodes of one rank too): counts the NaN/Inf among
  // `count` elements at byte `offset` of its input region, reading nothing else and writing
  // only the call's counter. The check where no node-local kernel reads the input: every
  // all-to-all, and the collectives on a node of one rank.
  kCountNonFinite,
};

// The reduction NCCL applies between the nodes.
enum class SpanNcclOp {
  kNone,          // broadcast
  kSum,           // ncclSum
  kMin,           // ncclMin
  kMax,           // ncclMax
  kProduct,       // ncclProd
  kPreMulSumAvg,  // ncclRedOpCreatePreMulSum with 1 / global world size: the global average
};

struct SpanStep {
  SpanStepKind kind = SpanStepKind::kLocalBarrier;
  size_t offset = 0;  // bytes from the start of the data region
  size_t count = 0;   // elements
  DataType dtype = DataType::kFloat32;
  ReduceOp local_op = ReduceOp::kSum;  // node-local reductions (kAvg becomes kSum)
  SpanNcclOp nccl_op = SpanNcclOp::kNone;
  int root = -1;              // kLocalBroadcast: a local rank; kNcclBroadcast: a node index
  int lane = -1;              // NCCL steps: the communicator; -1 for node-local steps
  bool from_scratch = false;  // kNcclAllReduce: reads the scratch rather than the region
  bool to_scratch = false;    // kNcclAllReduce: writes the scratch rather than the region
  // Counts NaN/Inf in this rank's input elements it reads (kLocalAllReduce, kLocalAllGather
  // and kCountNonFinite: [offset, +count); kLocalReduceScatter: [offset, +count * local);
  // kLocalBroadcast: the root's [offset, +count)). Every input element of every global rank
  // is read so exactly once per call (span_plan_test), nodes of one rank included.
  bool reads_input = false;
  // kLocalBroadcast: the view it runs over (kIn or kOut); kLocalCopy: where it reads.
  SpanBuffer buffer = SpanBuffer::kIn;
  SpanBuffer dst = SpanBuffer::kIn;  // kLocalCopy: where it writes
  int src_owner = -1;                // kLocalCopy: -1 this rank, else a local rank (peer-mapped)
  int dst_owner = -1;
  size_t dst_offset = 0;                // kLocalCopy: bytes
  std::vector<SpanTransfer> transfers;  // kNcclSendRecv
  bool operator==(const SpanStep&) const = default;
};

struct SpanPlan {
  std::vector<SpanStep> steps;  // this rank's, in enqueue order
  size_t scratch_bytes = 0;     // device scratch outside every data region
  bool uses_lane = false;       // whether this rank's communicator (lane = its local rank) is used
};

// This rank's steps for an all-reduce of `count` elements of `dtype` at byte `offset` of every
// rank's data region. UNIMPLEMENTED for kAvg of an integer type (see above); INVALID_ARGUMENT
// for a shape that does not hold this rank.
absl::StatusOr<SpanPlan> PlanSpanAllReduce(const SpanShape& shape, size_t offset, size_t count,
                                           DataType dtype, ReduceOp op, size_t lane_min_bytes);

// This rank's steps for a broadcast of `count` elements at the start of the data region from
// local rank `root_local` of node `root_node`.
absl::StatusOr<SpanPlan> PlanSpanBroadcast(const SpanShape& shape, size_t count, DataType dtype,
                                           int root_node, int root_local);

// This rank's steps for a barrier.
absl::StatusOr<SpanPlan> PlanSpanBarrier(const SpanShape& shape);

// This rank's steps for an all-gather of `count` elements per rank: input at the start of
// the input region, output global_size * count elements at the start of the output region,
// global rank j's block at j * count.
absl::StatusOr<SpanPlan> PlanSpanAllGather(const SpanShape& shape, size_t count, DataType dtype);

// A reduce-scatter: input global_size * count elements (block j for global rank j) at the start
// of the input region, which it overwrites; output `count` elements at the start of the output
// region. The all-reduce's ops and refusals.
absl::StatusOr<SpanPlan> PlanSpanReduceScatter(const SpanShape& shape, size_t count, DataType dtype,
                                               ReduceOp op, size_t lane_min_bytes);

// An all-to-all of equal blocks of `count` elements: input block j (for global rank j) and
// output block i (from global rank i) at i * count of the input and output regions.
absl::StatusOr<SpanPlan> PlanSpanAllToAll(const SpanShape& shape, size_t count, DataType dtype);

// Appends `more` to `plan` (a coalesced all-reduce: one plan per tensor, one scratch).
void AppendSpanPlan(SpanPlan& plan, const SpanPlan& more);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_SPAN_PLAN_H_
