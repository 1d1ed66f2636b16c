// Internal to the SDK, built only with CUDA: what a group spanning nodes on CUDA memory adds to
// the CUDA backend (cuda_collectives.cc), docs/cluster.md "Collectives across nodes".
//
//   every rank   polls its lane's NCCL communicator for an asynchronous error (a failure fails
//                the group for good and asks the daemon to abort it on every node); then the
//                group's SpanAgreement (span_agreement.h) alone, over the group's words, which
//                live in host memory: every rank of every node made this call, or
//                INVALID_ARGUMENT on every rank before anything is enqueued. The calling thread
//                blocks until every rank has called: the agreement is on the CPU, the data stay
//                on the device.
//   every rank   plans its steps (kernels/span_plan.h) and enqueues them on the call's stream
//                between the recorder's stream-ordered Started/Completed writes, as a node-local
//                CUDA call: commd's node-local kernels over the node's symmetric memory, and
//                NCCL between the nodes on its lane's communicator (cuda_span_nccl.h: local
//                rank l with rank l of every node; NCCL rank = node index). It returns without
//                waiting for the device.
//
// The part holds the group's SpanAgreement and its lane's SpanNcclLane (the communicator, made
// by the lane's first call that needs it).
//
// Abort: the group's abort hook (Close) fails the agreement's gloo connections, stops any
// NCCL call this rank is polling, and ncclCommAbort's the communicator, which ends NCCL's work
// still running on the device; the node-local kernels end on the abort word as always.
#ifndef COMMD_CLIENT_SRC_CUDA_SPAN_COLLECTIVES_H_
#define COMMD_CLIENT_SRC_CUDA_SPAN_COLLECTIVES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/src/collective_call.h"
#include "client/src/span_agreement.h"
#include "kernels/algorithm.h"
#include "kernels/cuda/collectives.h"
#include "kernels/span_plan.h"

namespace commd {

class CudaSpanPart {
 public:
  virtual ~CudaSpanPart() = default;
  // Before anything of the call is made or enqueued: NCCL's asynchronous error, then the
  // agreement. Blocks.
  virtual absl::Status Agree(const CheckedCall& c) = 0;
  // This rank's steps for the agreed call; UNIMPLEMENTED (the same on every rank) for what
  // has none across nodes on CUDA memory.
  virtual absl::StatusOr<kernels::SpanPlan> Plan(const CheckedCall& c) = 0;
  // Enqueues `plan` on `stream` with the group's device current; *enqueued counts the steps
  // queued. `v` is the view over the call's input buffer, `out` over its output buffer (null
  // for the in-place collectives). Makes the lane's communicator first if the plan needs it
  // (blocks until every member has joined).
  virtual absl::Status Launch(const kernels::SpanPlan& plan, const kernels::CudaCommView& v,
                              const kernels::CudaCommView* out, kernels::NanCheck nan,
                              const kernels::AllReduceThresholds& thresholds, void* scratch,
                              cudaStream_t stream, int* enqueued) = 0;
  // The group was aborted (the client's event thread).
  virtual void Close() = 0;
  // The call failed after the agreement: the ranks are out of step, so ask the daemon to
  // abort the group on every node (best effort).
  virtual void Failed(const absl::Status& why) = 0;
};

std::unique_ptr<CudaSpanPart> MakeCudaSpanPart(SpanSetup setup);

// Bytes of scratch `plan` needs on a node of `local` ranks: its own, and a one-shot in-place
// node-local all-reduce's (kernels/cuda/collectives.h) wherever `thresholds` choose one-shot.
size_t SpanScratchBytes(const kernels::SpanPlan& plan, int local,
                        const kernels::AllReduceThresholds& thresholds);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_CUDA_SPAN_COLLECTIVES_H_
