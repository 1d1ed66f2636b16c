// Internal to the SDK, built only with CUDA: the state of a group's collectives on CUDA buffers
// (cuda_collectives.h describes what it keeps) and the bookkeeping the CUDA backend does on it
// for every call: retiring finished calls, their NaN/Inf counters, each stream's scratch, the
// refusal of a capturing stream and the fused matmuls' cuBLAS handle.
//
//   absl::MutexLock lock(&state->mu);
//   ContextScope scope(*state);
//   RETURN_IF_ERROR(PollCalls(*state, group));  // an earlier call's deferred failure
//   const int slot = TakeCountSlot(*state);
//
// Every function here but RefuseCapture needs the state's mu held (its calls may wait for
// enqueued work to finish).
#ifndef COMMD_CLIENT_SRC_CUDA_GROUP_STATE_H_
#define COMMD_CLIENT_SRC_CUDA_GROUP_STATE_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/src/cuda_collectives.h"
#include "client/src/recorder_impl.h"
#include "common/cuda_driver_api.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda_plan.h"

namespace commd {

struct CudaGroupState {
  // NaN/Inf counters, one per enqueued call: a call waits for the oldest to finish when all
  // are taken.
  static constexpr int kCountSlots = 64;

  // The pinned host block the kernels write into (through its device address).
  struct DeviceWords {
    uint32_t error;  // code << 16 | peer of the first failed wait
    uint32_t unused;
    unsigned long long nonfinite[kCountSlots];
  };

  struct Pending {
    CUevent done;
    RecordId id;
    int slot;
    bool checked;      // whether the call counted NaN/Inf
    uintptr_t stream;  // the stream it was enqueued on (its scratch is that stream's)
  };

  const CudaDriverApi* api = nullptr;
  Recorder::Impl* recorder = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained
  absl::Mutex mu;
  DeviceWords* words ABSL_GUARDED_BY(mu) = nullptr;
  CUdeviceptr words_device ABSL_GUARDED_BY(mu) = 0;
  // One-shot scratch per stream (kernels/cuda_plan.h): calls on two streams may run at once.
  kernels::ScratchTable scratch_table ABSL_GUARDED_BY(mu);
  CUdeviceptr scratch[kernels::ScratchTable::kMaxStreams] ABSL_GUARDED_BY(mu) = {};
  std::deque<Pending> pending ABSL_GUARDED_BY(mu);
  kernels::CounterSlots slots ABSL_GUARDED_BY(mu){kCountSlots};
  absl::Status failed ABSL_GUARDED_BY(mu);  // sticky: the group's CUDA buffers are unusable
  // The fused matmuls' cuBLAS handle, made in `context` by the group's first one, for every
  // stream; each stream's workspace (cublas_workspace_bytes) lies in its scratch above.
  const kernels::CublasApi* blas = nullptr;
  cublasHandle_t cublas ABSL_GUARDED_BY(mu) = nullptr;
  size_t cublas_workspace_bytes ABSL_GUARDED_BY(mu) = 0;
  // The warming GEMMs' operands (kernels::WarmCublas), kept until `warmed` says they ran.
  CUdeviceptr warm_operands ABSL_GUARDED_BY(mu) = 0;
  CUevent warmed ABSL_GUARDED_BY(mu) = nullptr;
};

// The state's context is current on this thread for the scope's life.
class ContextScope {
 public:
  explicit ContextScope(const CudaGroupState& s) : api_(s.api) {
    pushed_ = api_->ctx_push_current(s.context) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    CUcontext ignored;
    if (pushed_) api_->ctx_pop_current(&ignored);
  }
  bool ok() const { return pushed_; }

 private:
  const CudaDriverApi* api_;
  bool pushed_;
};

// Retires what has finished, then fails (for good) if a wait failed on the device.
absl::Status PollCalls(CudaGroupState& s, const std::string& group)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// A NaN/Inf counter for the next call, zeroed: one no call still in flight may write (a call
// holds its slot until retired, kernels/cuda_plan.h's CounterSlots).
int TakeCountSlot(CudaGroupState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// `stream`'s scratch of at least `bytes` (none for 0): each stream has its own, since calls
// on two streams may run at once; a stream's calls run in order and share it. Growing or
// taking another stream's waits for the calls on the stream that used it.
absl::StatusOr<void*> StreamScratch(CudaGroupState& s, uintptr_t stream, size_t bytes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// A stream being captured into a CUDA graph is refused: the call's bookkeeping (its event,
// NaN/Inf slot, scratch, the recorder's stream-ordered writes) is made for one run at enqueue
// time, while a graph's kernels run at each replay, later and possibly many times.
absl::Status RefuseCapture(CudaGroupState& s, const std::string& group, void* stream);

// The group's cuBLAS handle, made once in its context (current here) before any of its fused
// matmul steps is enqueued: the library chosen for this driver (kernels::Cublas), the fused
// kernels loaded, and every cuBLAS GEMM type the fused calls use warmed on `stream`
// (kernels::WarmCublas): lazy loading would otherwise load them while a wait kernel spins on
// a peer (collectives.h). FAILED_PRECONDITION naming the group when no cuBLAS serves.
absl::Status MakeCublasHandle(CudaGroupState& s, const std::string& group, void* stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_CUDA_GROUP_STATE_H_
