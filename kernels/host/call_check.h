// The per-call check of the CPU collectives: every rank publishes a signature of its call
// and its NaN/Inf finding in its own signal pad before the staging barrier, and reads every
// peer's after it (protocol and channels: kernels/signal_layout.h). Internal to kernels/host.
//
//   const CallWords mine = MakeCallWords(CallSignature{.kind = kind, .tensors = ts}, nonfinite);
//   PublishCall(view, mine);
//   RETURN_IF_ERROR(HostBarrier(view, name));
//   absl::Status agreed = CheckCalls(view, kind, mine, result);  // same verdict on every rank
#ifndef COMMD_KERNELS_HOST_CALL_CHECK_H_
#define COMMD_KERNELS_HOST_CALL_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"
#include "kernels/host/plan.h"

namespace commd::kernels {

// What one rank publishes: the words of channels 2 to 5.
struct CallWords {
  uint32_t call = 0;       // 31-bit call hash << 1 | NaN/Inf found
  uint32_t nan_count = 0;  // saturated
  uint32_t count = 0;      // first tensor's count, saturated
  // kind | op << 4 | algorithm << 8 | dtype << 12 | tensors << 16 (broadcast: root << 16)
  uint32_t shape = 0;
};

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

// Stores `words` in this rank's own pad (relaxed: the staging barrier publishes them).
void PublishCall(const HostCommView& view, const CallWords& words);

// After the staging barrier: INVALID_ARGUMENT naming the ranks and their calls when some
// rank's call hash differs from rank 0's; else OK and, when `result` is not null, its
// group-wide NaN/Inf fields. Every rank reaches the same verdict and the same fields.
absl::Status CheckCalls(const HostCommView& view, CollectiveOp kind, CollectiveResult* result);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_CALL_CHECK_H_
