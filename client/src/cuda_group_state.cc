// The state of a group's collectives on CUDA buffers: see cuda_group_state.h.
#include "client/src/cuda_group_state.h"

#include <atomic>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/control_block.h"
#include "common/cuda_check.h"
#include "common/cuda_driver.h"
#include "common/status_macros.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/fused_matmul.h"

namespace commd {
namespace {

// A finished call: its NaN/Inf count reaches the control block (the entry is flagged on a hit).
// A part's is its part_of entry's: each part counts one check, and a hit flags that entry
// (the flag is a bit: several parts, or one after the entry completed, flag it alike).
void Retire(CudaGroupState& s, const CudaGroupState::Pending& p)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (p.checked) {
    const auto count = std::atomic_ref(s.words->nonfinite[p.slot]).load(std::memory_order_acquire);
    s.recorder->NanChecked(p.id, count > 0);
  }
  s.slots.Release(p.slot);
  s.api->event_destroy(p.done);
}

// Retires the oldest call, waiting for it when `wait`; false when it is still running.
bool RetireFront(CudaGroupState& s, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const CudaGroupState::Pending& p = s.pending.front();
  const CUresult r = wait ? s.api->event_synchronize(p.done) : s.api->event_query(p.done);
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS && s.failed.ok()) {
    s.failed =
        absl::InternalError(absl::StrCat("an earlier CUDA collective (seq ", p.id.collective_seq_id,
                                         ") failed on the device: ", CuErrorText(r)));
  }
  Retire(s, p);
  s.pending.pop_front();
  return true;
}

// Waits until no enqueued call runs on `stream` (it may be using that stream's scratch).
void WaitForStream(CudaGroupState& s, uintptr_t stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  auto on_stream = [&] {
    for (const CudaGroupState::Pending& p : s.pending) {
      if (p.stream == stream) return true;
    }
    return false;
  };
  while (on_stream()) RetireFront(s, /*wait=*/true);
}

}  // namespace

// Retires what has finished, then fails (for good) if a wait failed on the device.
absl::Status PollCalls(CudaGroupState& s, const std::string& group)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  while (!s.pending.empty() && RetireFront(s, /*wait=*/false)) {
  }
  const uint32_t word = std::atomic_ref(s.words->error).load(std::memory_order_acquire);
  if (s.failed.ok() && word != 0) s.failed = DeviceWaitError(word, group);
  return s.failed;
}

// A NaN/Inf counter for the next call, zeroed: one no call still in flight may write (a call
// holds its slot until retired, kernels/cuda_plan.h's CounterSlots).
int TakeCountSlot(CudaGroupState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  int slot;
  while ((slot = s.slots.Take()) < 0) RetireFront(s, /*wait=*/true);
  std::atomic_ref(s.words->nonfinite[slot]).store(0, std::memory_order_release);
  return slot;
}

// `stream`'s scratch of at least `bytes` (none for 0): each stream has its own, since calls
// on two streams may run at once; a stream's calls run in order and share it. Growing or
// taking another stream's waits for the calls on the stream that used it.
absl::StatusOr<void*> StreamScratch(CudaGroupState& s, uintptr_t stream, size_t bytes)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (bytes == 0) return nullptr;
  using Action = kernels::ScratchTable::Action;
  const kernels::ScratchTable::Choice c = s.scratch_table.Choose(stream, bytes);
  if (c.action == Action::kGrow) WaitForStream(s, stream);
  if (c.action == Action::kEvict) WaitForStream(s, c.evicted);
  if (c.action != Action::kReuse) {
    if (s.scratch[c.slot] != 0) s.api->mem_free(s.scratch[c.slot]);
    s.scratch[c.slot] = 0;
    s.scratch_table.Clear(c.slot);  // empty until the allocation succeeds
    CU_RETURN_IF_ERROR(s.api->mem_alloc(&s.scratch[c.slot], c.bytes));
  }
  s.scratch_table.Commit(c.slot, stream, c.bytes);
  return reinterpret_cast<void*>(s.scratch[c.slot]);
}

// A stream being captured into a CUDA graph is refused: the call's bookkeeping (its event,
// NaN/Inf slot, scratch, the recorder's stream-ordered writes) is made for one run at enqueue
// time, while a graph's kernels run at each replay, later and possibly many times.
absl::Status RefuseCapture(CudaGroupState& s, const std::string& group, void* stream) {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult r = s.api->stream_is_capturing(static_cast<CUstream>(stream), &capture);
      r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group, ": cuStreamIsCapturing on the collective's stream failed (",
        CuErrorText(r), "); is another stream capturing a CUDA graph in global mode?"));
  }
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group ", group, ": the collective's stream is ",
        capture == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "capturing" : "in an invalidated capture of",
        " a CUDA graph; collectives on CUDA buffers cannot be captured (run them outside the "
        "graph, docs/operations.md \"CUDA graphs\")"));
  }
  return absl::OkStatus();
}

// The group's cuBLAS handle, made once in its context (current here) before any of its fused
// matmul steps is enqueued: the library chosen for this driver (kernels::Cublas), the fused
// kernels loaded, and every cuBLAS GEMM type the fused calls use warmed on `stream`
// (kernels::WarmCublas): lazy loading would otherwise load them while a wait kernel spins on
// a peer (collectives.h). FAILED_PRECONDITION naming the group when no cuBLAS serves.
absl::Status MakeCublasHandle(CudaGroupState& s, const std::string& group, void* stream)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (s.cublas != nullptr && s.warmed != nullptr) return absl::OkStatus();
  if (s.cublas == nullptr) {
    absl::StatusOr<const kernels::CublasApi*> blas = kernels::Cublas(s.api->driver_version);
    if (!blas.ok()) {
      return absl::Status(blas.status().code(),
                          absl::StrCat("group ", group, ": ", blas.status().message()));
    }
    RETURN_IF_ERROR(kernels::PreloadFusedMatmulKernels());
    int major = 0;  // unknown: cuBLAS's smaller recommendation
    if (s.api->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                    s.device) != CUDA_SUCCESS) {
      major = 0;
    }
    CUBLAS_RETURN_IF_ERROR(**blas, (*blas)->create(&s.cublas));
    s.blas = *blas;
    s.cublas_workspace_bytes = kernels::CublasWorkspaceBytes(major);
  }
  if (s.warm_operands == 0) {
    CU_RETURN_IF_ERROR(s.api->mem_alloc(&s.warm_operands, kernels::kWarmCublasBytes));
  }
  CUevent warmed = nullptr;
  CU_RETURN_IF_ERROR(s.api->event_create(&warmed, CU_EVENT_DISABLE_TIMING));
  absl::Status st =
      kernels::WarmCublas({s.blas, s.cublas, 0}, reinterpret_cast<void*>(s.warm_operands),
                          static_cast<cudaStream_t>(stream));
  const CUresult recorded = s.api->event_record(warmed, static_cast<CUstream>(stream));
  if (st.ok() && recorded != CUDA_SUCCESS) {
    st = absl::InternalError(
        absl::StrCat("cuEventRecord after warming cuBLAS: ", CuErrorText(recorded)));
  }
  if (recorded != CUDA_SUCCESS) {
    s.api->event_destroy(warmed);  // the operands then stay until the group's context goes
  } else {
    if (s.warmed != nullptr) s.api->event_destroy(s.warmed);  // an earlier, failed warming's
    s.warmed = warmed;
  }
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("group ", group, ": warming cuBLAS: ", st.message()));
  }
  return absl::OkStatus();
}

void CudaGroupStateDeleter::operator()(CudaGroupState* s) const {
  {
    absl::MutexLock lock(&s->mu);
    ContextScope scope(*s);
    while (!s->pending.empty()) RetireFront(*s, /*wait=*/true);
    if (s->warmed != nullptr) {  // else the operands are left to the context: no event says
                                 // whether the warming GEMMs ran
      s->api->event_synchronize(s->warmed);
      s->api->event_destroy(s->warmed);
      if (s->warm_operands != 0) s->api->mem_free(s->warm_operands);
    }
    if (s->cublas != nullptr) s->blas->destroy(s->cublas);
    for (CUdeviceptr scratch : s->scratch) {
      if (scratch != 0) s->api->mem_free(scratch);
    }
    if (s->words != nullptr) s->api->mem_free_host(s->words);
  }
  s->api->primary_ctx_release(s->device);
  delete s;
}

absl::StatusOr<CudaGroupStatePtr> CreateCudaGroupState(int device, Recorder::Impl* recorder) {
  const CudaDriverInfo& cuda = ProbeCudaDriver();
  if (!cuda.available || device < 0 || device >= cuda.device_count) {
    return absl::FailedPreconditionError(
        absl::StrCat("collectives on CUDA buffers of device cuda:", device,
                     " need a CUDA driver and that device (", cuda.summary, ")"));
  }
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  // The daemon (no runtime) accepts drivers from 12.0; the kernels' statically linked runtime
  // needs its own major version. Said here, with both versions, rather than as the runtime's
  // cudaErrorInsufficientDriver at the first kernel preload.
  if (absl::Status st = CheckDriverServesRuntime(api->driver_version, api->library, CUDART_VERSION);
      !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("collectives on CUDA buffers of device cuda:", device, ": ", st.message()));
  }
  auto s = std::make_unique<CudaGroupState>();
  s->api = api;
  s->recorder = recorder;
  CU_RETURN_IF_ERROR(api->device_get(&s->device, device));
  CU_RETURN_IF_ERROR(api->primary_ctx_retain(&s->context, s->device));
  CudaGroupStatePtr state(s.release());  // from here the deleter releases the context
  absl::MutexLock lock(&state->mu);
  ContextScope scope(*state);
  if (!scope.ok()) return absl::InternalError("cuCtxPushCurrent of the primary context failed");
  void* words = nullptr;
  CU_RETURN_IF_ERROR(api->mem_host_alloc(&words, sizeof(CudaGroupState::DeviceWords),
                                         CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  state->words = new (words) CudaGroupState::DeviceWords{};
  CU_RETURN_IF_ERROR(api->mem_host_get_device_pointer(&state->words_device, words, 0));
  // Before any of the group's kernels can spin on a peer (lazy loading; collectives.h).
  RETURN_IF_ERROR(kernels::PreloadCudaKernels());
  return state;
}

absl::Status DeviceWaitError(uint32_t word, const std::string& group) {
  const uint32_t code = word >> 16, peer = word & 0xffff;
  const std::string after =
      "; the group's CUDA buffers are unusable from then on (leave the group)";
  switch (code) {
    case 0:
      return absl::OkStatus();
    case 1:
      return absl::AbortedError(absl::StrCat("group ", group,
                                             ": an earlier collective on CUDA buffers was aborted "
                                             "while waiting for rank ",
                                             peer, after));
    case 2:
      return absl::DeadlineExceededError(absl::StrCat(
          "group ", group, ": an earlier collective on CUDA buffers timed out waiting for rank ",
          peer, after));
    default:
      return absl::InternalError(absl::StrCat("group ", group, ": device error word 0x",
                                              absl::Hex(word), " has unknown code ", code,
                                              " (allowed: 1 aborted, 2 timed out)"));
  }
}

}  // namespace commd
