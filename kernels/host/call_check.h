// The per-call check of the CPU collectives: every rank sends a signature of its call and its
// NaN/Inf finding in the collective's exchange, and compares every rank's once they are here
// (protocol: kernels/signal_layout.h). Internal to kernels/host.
//
//   HostExchange x(view, name);
//   x.Send(MakeCallWords(CallSignature{.kind = kind, .tensors = ts}, nonfinite), 0);
//   RETURN_IF_ERROR(x.WaitForAll());
//   absl::Status agreed = CheckCalls(x, kind, result);  // same verdict on every rank
#ifndef COMMD_KERNELS_HOST_CALL_CHECK_H_
#define COMMD_KERNELS_HOST_CALL_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/host/barrier.h"
#include "kernels/host/collectives.h"
#include "kernels/host/plan.h"

namespace commd::kernels {

// A call as every rank must make it. Fields a kind does not have keep their defaults, so
// that equal calls hash equally.
struct CallSignature {
  CollectiveOp kind = CollectiveOp::kAllReduce;
  ReduceOp op = ReduceOp::kSum;               // all-reduce and reduce-scatter
  Algorithm algorithm = Algorithm::kOneShot;  // all-reduce
  int root = 0;                               // broadcast, in [0, world size)
  absl::Span<const TensorArgs> tensors;
  // Where the tensors sit in the data regions (a digest of the staging offsets and whether
  // the inputs are in place): two-shot writes into the peers' regions at its own offsets, so
  // ranks that staged elsewhere must fail the check before anything is pushed.
  uint64_t staging = 0;
};

// The enums and the root must be valid (checked before the call is staged).
CallWords MakeCallWords(const CallSignature& call, uint64_t nonfinite);

// `words` (made with no NaN finding) with this rank's NaN/Inf count: MakeCallWords(call, n) ==
// AddNonfinite(MakeCallWords(call, 0), n). The hash does not depend on the count, so a
// prepared call (plan.h) hashes once.
CallWords AddNonfinite(CallWords words, uint64_t nonfinite);

// Once every rank's message of exchange `x` is here: INVALID_ARGUMENT naming the ranks and
// their calls when some rank's call hash differs from rank 0's; else OK and, when `result` is
// not null, its group-wide NaN/Inf fields. Every rank reaches the same verdict and the same
// fields.
absl::Status CheckCalls(const HostExchange& x, CollectiveOp kind, CollectiveResult* result);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_CALL_CHECK_H_
