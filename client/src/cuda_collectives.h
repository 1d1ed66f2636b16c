// Internal to the SDK: the CUDA backend of Group's collectives (cuda_collectives.cc, built
// only with CUDA). Group::Run checks the arguments as for host buffers and hands over here;
// this enqueues kernels/cuda's launches on the caller's stream between the recorder's
// stream-ordered Started/Completed writes and returns without waiting (as NCCL does).
//
// Per group it keeps (CudaGroupState, made on the first CUDA collective): the device's
// primary context, a device-mapped pinned host block with the error word the kernels' waits
// fail into and the per-call NaN/Inf counters, a device scratch buffer per stream for one-shot
// in-place all-reduces grown on demand (kernels/cuda_plan.h), and an event per enqueued call.
// A stream capturing a CUDA graph is refused; a launch failing once any kernel of the call is
// queued fails the group for good (the ranks' barrier counts differ from then on). Each call first
// retires the calls found complete (their NaN/Inf counts go to the control block's nan counters)
// and then reads the error word: nonzero fails this and every later call of the group.
#ifndef COMMD_CLIENT_SRC_CUDA_COLLECTIVES_H_
#define COMMD_CLIENT_SRC_CUDA_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/src/collective_call.h"
#include "client/src/recorder_impl.h"
#include "client/src/span_collectives.h"

namespace commd {

struct CudaGroupState;
struct CudaGroupStateDeleter {
  void operator()(CudaGroupState* state) const;  // waits for the group's enqueued calls
};
using CudaGroupStatePtr = std::unique_ptr<CudaGroupState, CudaGroupStateDeleter>;

// The state of a group on CUDA device `device` whose NaN/Inf findings go to `recorder`.
// FAILED_PRECONDITION naming why when there is no CUDA driver or device, or when the driver is
// older than the CUDA runtime the SDK was built with needs (CheckDriverServesRuntime).
absl::StatusOr<CudaGroupStatePtr> CreateCudaGroupState(int device, Recorder::Impl* recorder);

// The status a device-side wait's failure word (code << 16 | peer; code 1 aborted, 2 timed
// out) stands for: ABORTED or DEADLINE_EXCEEDED naming the peer, INTERNAL for an unknown
// code, OK for 0.
absl::Status DeviceWaitError(uint32_t word, const std::string& group);

#ifdef COMMD_HAVE_CUDA
// The backend of a group on CUDA device `device`; its state is made on the first collective
// (FAILED_PRECONDITION there when there is no driver or device).
std::unique_ptr<CollectiveBackend> MakeCudaBackend(int device);
// The same for a group spanning nodes (cuda_span_collectives.h): each call agrees with every
// rank of every node first (the group's SpanAgreement), then enqueues its node-local kernels
// and NCCL calls; `close` ends its waits on other nodes.
SpanCollectives MakeCudaSpanCollectives(int device, SpanSetup setup);
#else
// Without CUDA there is no CUDA backend: the group's collectives say so (UNIMPLEMENTED).
inline std::unique_ptr<CollectiveBackend> MakeCudaBackend(int) { return nullptr; }
inline SpanCollectives MakeCudaSpanCollectives(int, SpanSetup) { return {}; }
#endif

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_CUDA_COLLECTIVES_H_
