// Internal to the SDK: Group's collectives on CUDA buffers (cuda_collectives.cc, built only
// with CUDA). collectives.cc checks the arguments as for host buffers and hands over here;
// this enqueues kernels/cuda's launches on the caller's stream between the recorder's
// stream-ordered Started/Completed writes and returns without waiting (as NCCL does).
//
// Per group it keeps (CudaGroupState, made on the first CUDA collective): the device's
// primary context, a device-mapped pinned host block with the error word the kernels' waits
// fail into and the per-call NaN/Inf counters, a device scratch buffer for one-shot in-place
// all-reduces grown on demand, and an event per enqueued call. Each call first retires the
// calls found complete (their NaN/Inf counts go to the control block's nan counters) and
// then reads the error word: nonzero fails this and every later call of the group.
#ifndef COMMD_CLIENT_SRC_CUDA_COLLECTIVES_H_
#define COMMD_CLIENT_SRC_CUDA_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/src/recorder_impl.h"
#include "commd/group.h"
#include "commd/v1/groups.pb.h"
#include "kernels/types.h"

namespace commd {

// Defined in collectives.cc: whether collective `seq` checks its input (the call's choice,
// else the group's).
kernels::NanCheck ResolveNanCheck(const CollectiveOptions& o, const v1::CollectiveSettings& group,
                                  uint64_t seq);

struct CudaGroupState;
struct CudaGroupStateDeleter {
  void operator()(CudaGroupState* state) const;  // waits for the group's enqueued calls
};
using CudaGroupStatePtr = std::unique_ptr<CudaGroupState, CudaGroupStateDeleter>;

// The state of a group on CUDA device `device` whose NaN/Inf findings go to `recorder`.
// FAILED_PRECONDITION naming why when there is no CUDA driver or device.
absl::StatusOr<CudaGroupStatePtr> CreateCudaGroupState(int device, Recorder::Impl* recorder);

// The status a device-side wait's failure word (code << 16 | peer; code 1 aborted, 2 timed
// out) stands for: ABORTED or DEADLINE_EXCEEDED naming the peer, INTERNAL for an unknown
// code, OK for 0.
absl::Status DeviceWaitError(uint32_t word, const std::string& group);

enum class CudaKind { kBarrier, kAllReduce, kAllGather, kReduceScatter };

// One kernel launch: all-reduce coalesced has one per tensor, the others one.
struct CudaLaunch {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  kernels::DataType dtype = kernels::DataType::kFloat32;
  kernels::Algorithm algorithm = kernels::Algorithm::kTwoShot;  // all-reduce only
};

// One collective, its arguments checked by collectives.cc.
struct CudaCollective {
  CudaKind kind = CudaKind::kBarrier;
  CollectiveOp record_op = CollectiveOp::kBarrier;
  SymmetricBuffer* view_buffer = nullptr;  // its peers and signal pads form the view
  std::vector<CudaLaunch> launches;
  kernels::ReduceOp op = kernels::ReduceOp::kSum;
  std::span<const TensorDesc> inputs, outputs;  // for the recorder
};

// What the group lends a CUDA collective.
struct CudaGroupContext {
  Group& group;
  Recorder::Impl& recorder;
  CudaGroupStatePtr& state;  // made here on first use
  const v1::CollectiveSettings& settings;
  absl::Duration group_timeout;  // recorded as the entry's timeout
  absl::Duration wait;           // each device-side wait's limit
};

// Enqueues `c` on options.cuda_stream (null: the legacy default stream). INVALID_ARGUMENT,
// synchronously and with nothing enqueued, for what the device path cannot do (a NaN policy
// of FAIL with the check on, nonfinite_count/nonfinite_ranks outputs, a view the kernels
// cannot take); ABORTED once the group is aborted; the deferred error of an earlier call.
absl::Status RunCudaCollective(const CudaGroupContext& g, const CudaCollective& c,
                               const CollectiveOptions& options);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_CUDA_COLLECTIVES_H_
