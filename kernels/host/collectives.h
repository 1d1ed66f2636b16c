// The collectives on the CPU, over symmetric host memory that every rank has mapped: barrier,
// all-reduce (one-shot and two-shot), all-gather, reduce-scatter, broadcast, all-to-all with
// equal splits, and coalesced variants of the first three that run many tensors as one
// collective (one copy-in pass, one barrier pair).
//
//   HostCommView view = ...;                       // see comm_view.h
//   CollectiveResult result;
//   // In place on this rank's data region, the SDK's Group::AllReduce:
//   RETURN_IF_ERROR(AllReduce(view, view.data[rank], view.data[rank], n, DataType::kBFloat16,
//                             ReduceOp::kSum, Algorithm::kTwoShot, NanCheck::kOn, &result));
//   if (result.nonfinite_ranks > 0) ...           // the caller applies its NaN policy
//
// Every rank of the view must make the same calls in the same order with the same counts,
// types, ops, algorithms and (for in-place inputs) the same offsets into its data region.
// The ranks check part of that: each publishes a 31-bit hash of its call (collective, op,
// algorithm, broadcast root, number of tensors, each tensor's count and type, the staging
// offsets and whether the inputs are in place) in its signal pad with its input staged, and
// when the hashes differ every rank returns INVALID_ARGUMENT naming the ranks and their calls,
// after one closing barrier and without reading or writing a peer's data: the allocation
// stays usable. Not detected: a call that fails validation on some ranks only, an empty call
// (count 0) against a non-empty one, hash collisions.
//
// Where the data goes. Each rank's data region is the staging area that peers read:
//   - input: either inside this rank's own data region (in place: staged where it is, at
//     the same offset on every rank) or disjoint from every rank's data region (then copied
//     into the region; coalesced calls pack the tensors from offset 0, each 64-byte aligned).
//     A coalesced call's inputs are all in place or all outside.
//   - output: for all-reduce and broadcast, either the input itself when the input is in
//     place (fully in place) or memory disjoint from every data region; for all-gather,
//     reduce-scatter and all-to-all, memory disjoint from every data region. Output may
//     overlap an input outside the data regions (inputs are copied in before any output is
//     written).
//   - broadcast stages only the root's buffer; the other ranks copy it from the root's data
//     region into theirs, so every rank passes its own buffer (in place at the same offset on
//     every rank, or outside the data regions on every rank).
//   - After the call this rank's data region holds the result where the output is in place;
//     elsewhere its staged contents are unspecified (two-shot pushes results into it).
//   - Pointers must be aligned to the element size. A count of 0 (every tensor empty) is a
//     no-op that does not synchronise.
// Synchronisation: copy-in, a barrier (every input staged), the reads (broadcast: every rank
// but the root reads the root's region; all-to-all: each rank reads its chunk of every peer's
// input), and a closing barrier (no rank overwrites its region while a peer may still read
// it). Two-shot all-reduce pushes each reduced chunk into every peer's region before its
// second barrier and then reads only its own region, so that barrier is its closing one. So
// back-to-back collectives on one allocation need no extra barrier.
//
// Errors: INVALID_ARGUMENT (naming the value and the allowed range) before anything is
// touched, or after staging when the ranks disagree on the call (above); ABORTED when the view's
// abort word is or becomes nonzero; DEADLINE_EXCEEDED when a peer does not arrive before the view's
// deadline (naming it and the collective). After ABORTED or DEADLINE_EXCEEDED from a wait, outputs
// are unspecified and the allocation must not be used for further collectives.
//
// All calls block until done. One thread per rank and allocation at a time.
#ifndef COMMD_KERNELS_HOST_COLLECTIVES_H_
#define COMMD_KERNELS_HOST_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd::kernels {

struct CollectiveResult {
  // NaN and +-Inf values in this rank's input (floating-point types with NanCheck::kOn).
  uint64_t nonfinite_count = 0;
  // The group-wide finding, identical on every rank: how many ranks found NaN/Inf in their
  // input (ranks that did not check count as clean), the lowest of them (-1: none) and the
  // sum of their counts (each saturated to 2^32 - 1).
  int nonfinite_ranks = 0;
  int first_nonfinite_rank = -1;
  uint64_t group_nonfinite_count = 0;
};

// One tensor of a collective. `count` is elements per rank: all-reduce and broadcast in = out
// = count; all-gather in = count, out = world_size * count (rank-major); reduce-scatter in =
// world_size * count (chunk p goes to rank p), out = count; all-to-all in = out = world_size *
// count (chunk p of the input goes to rank p, chunk p of the output came from rank p).
struct TensorArgs {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
};

absl::Status Barrier(const HostCommView& view);

// `result` may be null. A one-shot whose inputs fit one exchange slot's payload
// (kernels/signal_layout.h) sends them in the call's exchange and needs no barrier.
absl::Status AllReduce(const HostCommView& view, const void* input, void* output, size_t count,
                       DataType dtype, ReduceOp op, Algorithm algorithm, NanCheck nan_check,
                       CollectiveResult* result);
absl::Status AllGather(const HostCommView& view, const void* input, void* output, size_t count,
                       DataType dtype, NanCheck nan_check, CollectiveResult* result);
absl::Status ReduceScatter(const HostCommView& view, const void* input, void* output, size_t count,
                           DataType dtype, ReduceOp op, NanCheck nan_check,
                           CollectiveResult* result);

// Every rank's `buffer` receives the root's (in place: `buffer` is input and output).
// INVALID_ARGUMENT when root is outside [0, world_size). The NaN check counts the root's
// buffer only: on the other ranks nonfinite_count is 0 and the group-wide finding names the
// root.
absl::Status Broadcast(const HostCommView& view, void* buffer, size_t count, DataType dtype,
                       int root, NanCheck nan_check, CollectiveResult* result);
// Equal splits (MPI_Alltoall): chunk p (`count` elements) of this rank's output is chunk
// `rank` of rank p's input; input and output each hold world_size * count elements.
absl::Status AllToAll(const HostCommView& view, const void* input, void* output, size_t count,
                      DataType dtype, NanCheck nan_check, CollectiveResult* result);

// Many tensors (each with its own count and type) as one collective.
absl::Status AllReduceCoalesced(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                                ReduceOp op, Algorithm algorithm, NanCheck nan_check,
                                CollectiveResult* result);
absl::Status AllGatherCoalesced(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                                NanCheck nan_check, CollectiveResult* result);
absl::Status ReduceScatterCoalesced(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                                    ReduceOp op, NanCheck nan_check, CollectiveResult* result);

// A call prepared once and run many times (the SDK keeps one per buffer): PrepareAllReduce
// validates as AllReduceCoalesced does (same errors) and fills `prepared`, which
// AllReducePrepared then runs on the same view (INVALID_ARGUMENT for another view or a call
// whose preparation failed). A run is the call it was prepared from, on the same data: the
// inputs and outputs are read and written at run time. AllReduce and AllReduceCoalesced are
// these two in a row. `prepared` is overwritten; after an error it cannot be run.
struct PreparedCollective;  // plan.h
absl::Status PrepareAllReduce(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                              ReduceOp op, Algorithm algorithm, PreparedCollective* prepared);
absl::Status AllReducePrepared(const HostCommView& view, const PreparedCollective& prepared,
                               NanCheck nan_check, CollectiveResult* result);

// AllReduceThresholds::oversubscribed_one_shot_max_bytes for `world_size` ranks of one node
// (kernels/algorithm.h): the bytes one exchange carries when the ranks outnumber the node's
// online CPUs, else 0. The same on every rank of the node.
size_t OversubscribedOneShotMaxBytes(int world_size);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_COLLECTIVES_H_
