// Group's collectives on CUDA buffers: kernels/cuda launches on the caller's stream, recorded
// stream-ordered, with failures of the device-side waits reported by the group's next call.
#include "client/src/cuda_collectives.h"

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/src/cuda_group_state.h"
#include "client/src/cuda_span_collectives.h"
#include "client/src/group_aborted.h"
#include "common/control_block.h"
#include "common/cuda_check.h"
#include "common/cuda_driver_api.h"
#include "common/status_macros.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/fused_matmul.h"
#include "kernels/cuda_matmul_plan.h"
#include "kernels/cuda_plan.h"

namespace commd {
namespace {

using DeviceWords = CudaGroupState::DeviceWords;
using Pending = CudaGroupState::Pending;

// The fused matmul arguments of `call` on view `v` (its operands are the caller's device
// memory; the shard or workspace is the buffer's data region).
kernels::CudaMatmulArgs MatmulArgs(const CollectiveCall& call, kernels::NanCheck nan,
                                   std::span<kernels::MatmulB> bs, void* scratch) {
  const MatmulCall& m = *call.matmul;
  for (size_t i = 0; i < m.bs.size() && i < bs.size(); ++i) {
    bs[i] = {m.bs[i].data, m.bs[i].n, m.bs[i].out, m.bs[i].col_scale};
  }
  return {.gather = call.kind == CollectiveOp::kAllGatherMatmul,
          .rows = m.rows,
          .k = m.k,
          .dtype = call.dtype,
          .op = call.op,
          .bs = absl::MakeConstSpan(bs.data(), std::min(m.bs.size(), bs.size())),
          .row_scale = m.row_scale,
          .gathered = m.gathered,
          .a = m.a,
          .nan_check = nan,
          .scratch = scratch};
}

// The plan of a fused matmul on `v` (the NaN check does not change its scratch).
kernels::FusedMatmulPlan MatmulPlan(const kernels::CudaCommView& v, const CollectiveCall& call) {
  std::array<kernels::MatmulB, kernels::kMaxMatmulBs> bs;
  return kernels::PlanFusedMatmul(
      kernels::FusedShapeOf(v, MatmulArgs(call, kernels::NanCheck::kOff, bs, nullptr)));
}

// Bytes of scratch `c` needs: the largest one-shot all-reduce (in place, as the SDK's are), or
// a fused matmul's fp32 products of 16-bit scaled outputs followed by the stream's cuBLAS
// workspace of `workspace_bytes`.
size_t ScratchBytes(const kernels::CudaCommView& v, const CheckedCall& c, size_t workspace_bytes) {
  if (c.call.matmul != nullptr) {
    return kernels::LayOutFusedScratch(MatmulPlan(v, c.call).scratch_bytes, workspace_bytes)
        .total_bytes;
  }
  if (c.algorithm != kernels::Algorithm::kOneShot) return 0;
  const CollectiveCall& call = c.call;
  if (call.kind == CollectiveOp::kAllReduce) {
    return call.count * DataTypeSize(call.dtype);
  }
  size_t bytes = 0;
  if (call.kind != CollectiveOp::kAllReduceCoalesced) return 0;
  for (const CoalescedTensor& t : call.tensors) {
    bytes = std::max(bytes, t.count * DataTypeSize(t.dtype));
  }
  return bytes;
}

absl::StatusOr<kernels::CudaCommView> MakeView(CollectiveEntry& e, const CheckedCall& c,
                                               void* stream, const BufferViews* views = nullptr) {
  const kernels::HostCommView& host = (views != nullptr ? *views : c.views).host;
  const int n = host.world_size;
  if (n > kernels::kCudaMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", n, " is out of range [1, ",
                                                   kernels::kCudaMaxWorldSize,
                                                   "] for collectives on CUDA buffers"));
  }
  kernels::CudaCommView v;
  v.rank = host.rank;
  v.world_size = n;
  for (int p = 0; p < n; ++p) {
    v.data[p] = host.data[p];
    v.pads[p] = host.pads[p];
  }
  v.data_bytes = host.data_bytes;
  v.pad_slots = host.pad_slots;
  RETURN_IF_ERROR(kernels::ValidateCudaCommView(v));
  // The control block's first page is registered device-mapped by the recorder; the abort
  // word lies in it.
  static_assert(kAbortOffset + offsetof(ControlBlockAbort, reason) + sizeof(uint32_t) <= 4096);
  ASSIGN_OR_RETURN(
      const uint64_t abort_word,
      e.recorder_impl().DeviceAddress(stream, kAbortOffset + offsetof(ControlBlockAbort, reason)));
  v.abort_word = reinterpret_cast<const uint32_t*>(abort_word);
  v.timeout_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(c.wait));
  return v;
}

// One launch per tensor for coalesced calls (the device kernels take one tensor a launch);
// *enqueued counts the kernels that were.
absl::Status Launch(const kernels::CudaCommView& v, const CheckedCall& c, kernels::NanCheck nan,
                    void* scratch, const kernels::CublasContext& blas, cudaStream_t stream,
                    int* enqueued) {
  const CollectiveCall& call = c.call;
  const auto dtype = call.dtype;
  const auto op = call.op;
  std::byte* in = v.data[v.rank];
  absl::Status st;
  switch (call.kind) {
    case CollectiveOp::kBarrier:
      st = kernels::LaunchBarrier(v, stream);
      break;
    case CollectiveOp::kAllReduce:
      st = kernels::LaunchAllReduce(v, in, in, call.count, dtype, op, c.algorithm, nan, scratch,
                                    stream);
      break;
    case CollectiveOp::kAllReduceCoalesced:
      for (const CoalescedTensor& t : call.tensors) {
        if (t.count == 0) continue;  // nothing launched for it
        std::byte* p = in + t.offset;
        RETURN_IF_ERROR(kernels::LaunchAllReduce(v, p, p, t.count, t.dtype, op, c.algorithm, nan,
                                                 scratch, stream));
        ++*enqueued;
      }
      return absl::OkStatus();
    case CollectiveOp::kAllGather:
      st = kernels::LaunchAllGather(v, in, call.out->data(), call.count, dtype, nan, stream);
      break;
    case CollectiveOp::kReduceScatter:
      st =
          kernels::LaunchReduceScatter(v, in, call.out->data(), call.count, dtype, op, nan, stream);
      break;
    case CollectiveOp::kBroadcast:
      st = kernels::LaunchBroadcast(v, in, call.count, dtype, call.root, nan, stream);
      break;
    case CollectiveOp::kAllToAll:
      st = kernels::LaunchAllToAll(v, in, call.out->data(), call.count, dtype, nan, stream);
      break;
    case CollectiveOp::kAllGatherMatmul:
    case CollectiveOp::kMatmulReduceScatter: {
      std::array<kernels::MatmulB, kernels::kMaxMatmulBs> bs;
      return kernels::EnqueueFusedMatmul(v, MatmulArgs(call, nan, bs, scratch), blas, stream,
                                         enqueued);
    }
    default:
      return absl::UnimplementedError(
          absl::StrCat(CollectiveName(call.kind), " has no CUDA kernel in this SDK"));
  }
  if (st.ok()) ++*enqueued;
  return st;
}

// Kernels of this call that will be launched (coalesced: one per non-empty tensor; a fused
// matmul: its plan's steps, GEMMs included).
int KernelsOf(const kernels::CudaCommView& v, const CollectiveCall& call) {
  if (call.matmul != nullptr) return static_cast<int>(MatmulPlan(v, call).steps.size());
  if (call.kind != CollectiveOp::kAllReduceCoalesced) return 1;
  int n = 0;
  for (const CoalescedTensor& t : call.tensors) n += t.count > 0 ? 1 : 0;
  return n;
}

// What the device path refuses up front. A part (CollectiveOptions::part_of) is taken: its
// NaN/Inf count, known only once its kernels ran, is reported against the part_of entry when
// the call retires (Retire), which flags that entry however late; a failure is this call's
// status, the entry the caller's to abandon. NaN policy FAIL stays refused for parts too.
absl::Status CheckSupported(CollectiveEntry& e, const CollectiveOptions& o) {
  if (o.nonfinite_count != nullptr || o.nonfinite_ranks != nullptr) {
    return absl::InvalidArgumentError(
        "nonfinite_count and nonfinite_ranks need host buffers: a collective on CUDA buffers "
        "returns before the device has counted (the counts reach the control block's nan "
        "counters instead)");
  }
  Group& group = e.group();
  if (e.settings().nan_policy() == v1::NAN_POLICY_FAIL &&
      ResolveNanCheck(o, e.settings(), 0) == kernels::NanCheck::kOn) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group.name(),
                     ": nan_policy fail needs host buffers (a collective on CUDA "
                     "buffers returns before its NaN/Inf count exists); use nan_policy report or "
                     "CollectiveOptions::nan_check kOff"));
  }
  if (group.abort_requested()) {
    return GroupAbortedError(group.name(), group.abort_reason());
  }
  return absl::OkStatus();
}

// The group's failure after a call failed once `enqueued` of its `total` kernels were on the
// stream (issue #19 fix 7): peers' kernels wait at barriers this rank will never reach, so the
// ranks' barrier counts differ for good. For this call: FAILED_PRECONDITION naming why, or
// DEADLINE_EXCEEDED when why is a deadline that passed (a spanning group's NCCL step still in
// progress at the group's timeout).
absl::Status DesyncError(const std::string& group, const RecordId& id, int enqueued, int total,
                         const absl::Status& why) {
  return absl::Status(
      absl::IsDeadlineExceeded(why) ? absl::StatusCode::kDeadlineExceeded
                                    : absl::StatusCode::kFailedPrecondition,
      absl::StrCat("group ", group, ": collective seq ", id.collective_seq_id,
                   " on CUDA buffers enqueued ", enqueued, " of its ", total,
                   " kernels before failing (", why.message(),
                   "); the ranks' barrier counts now differ, so every later collective of the "
                   "group on CUDA buffers fails (leave the group; peers fail when their waits "
                   "time out or the group is aborted)"));
}

// What every later call gets (the group's sticky failure): FAILED_PRECONDITION, the group
// being in no state to run it, carrying the first failure.
absl::Status FailedEarlier(const std::string& group, const absl::Status& first) {
  if (absl::IsFailedPrecondition(first)) return first;
  return absl::FailedPreconditionError(
      absl::StrCat("group ", group, " failed for good earlier: ", first.message()));
}

// A spanning group's call: its plan and the part that launches it (null for node-local calls).
struct SpanLaunch {
  const kernels::SpanPlan* plan = nullptr;
  CudaSpanPart* part = nullptr;
  kernels::AllReduceThresholds thresholds;
  // The view over the call's output buffer (all-gather, reduce-scatter, all-to-all), whose
  // node-local steps wait on its own signal pads (every local rank makes the same steps).
  std::optional<kernels::CudaCommView> out;
};

// A spanning group's plan over `v`, its output view with the same device words as `v`.
absl::Status LaunchPlan(const SpanLaunch& span, const kernels::CudaCommView& v,
                        kernels::NanCheck nan, void* scratch, cudaStream_t stream, int* enqueued) {
  std::optional<kernels::CudaCommView> out = span.out;
  if (out.has_value()) {
    out->error_word = v.error_word;
    out->nonfinite_count = v.nonfinite_count;
  }
  return span.part->Launch(*span.plan, v, out.has_value() ? &*out : nullptr, nan, span.thresholds,
                           scratch, stream, enqueued);
}

// Records the entry around the launch, stream-ordered, and keeps an event for its end (a
// part records nothing: its part_of entry's transitions are the caller's, on the same stream).
// An argument check failing before any kernel is enqueued fails this call alone; any other
// failure fails the group (kernels::LaunchFailureDesyncs).
absl::Status Enqueue(CudaGroupState& s, const CheckedCall& c, CollectiveEntry& e,
                     kernels::CudaCommView v, void* scratch, const SpanLaunch& span = {})
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const kernels::CublasContext blas{s.blas, s.cublas, s.cublas_workspace_bytes};
  const CollectiveOptions& o = *c.call.options;
  CUevent done = nullptr;
  CU_RETURN_IF_ERROR(s.api->event_create(&done, CU_EVENT_DISABLE_TIMING));
  const int slot = TakeCountSlot(s);
  v.error_word = reinterpret_cast<uint32_t*>(s.words_device + offsetof(DeviceWords, error));
  v.nonfinite_count = reinterpret_cast<unsigned long long*>(
      s.words_device + offsetof(DeviceWords, nonfinite) + slot * sizeof(unsigned long long));
  e.Begin();
  // A part's id is its part_of entry's: the part's NaN/Inf count and a failure of its kernels
  // on the device are that entry's.
  const RecordId id = e.id();
  auto* stream = static_cast<cudaStream_t>(o.cuda_stream);
  int enqueued = 0;
  absl::Status st = e.StartedOnStream(o.cuda_stream);
  if (st.ok() && span.plan != nullptr) {
    st = LaunchPlan(span, v, e.nan(), scratch, stream, &enqueued);
  } else if (st.ok()) {
    st = Launch(v, c, e.nan(), scratch, blas, stream, &enqueued);
  }
  if (st.ok()) st = e.CompletedOnStream(o.cuda_stream);
  // Recorded even after a failure once kernels are queued: the slot (and the scratch) stay
  // taken until they have run.
  const CUresult recorded = s.api->event_record(done, static_cast<CUstream>(o.cuda_stream));
  if (st.ok() && recorded != CUDA_SUCCESS) {
    st = absl::InternalError(absl::StrCat("cuEventRecord: ", CuErrorText(recorded)));
  }
  const Pending pending{done, id, slot, e.nan() == kernels::NanCheck::kOn,
                        reinterpret_cast<uintptr_t>(o.cuda_stream)};
  if (st.ok()) {
    s.pending.push_back(pending);
    return absl::OkStatus();
  }
  e.Abandon();  // a part leaves its part_of entry to the caller
  if (!kernels::LaunchFailureDesyncs(enqueued, st)) {
    s.slots.Release(slot);
    s.api->event_destroy(done);
    return st;
  }
  const int total =
      span.plan != nullptr ? static_cast<int>(span.plan->steps.size()) : KernelsOf(v, c.call);
  const absl::Status first = DesyncError(e.group().name(), id, enqueued, total, st);
  s.failed = FailedEarlier(e.group().name(), first);
  if (recorded == CUDA_SUCCESS && enqueued > 0) {
    s.pending.push_back({done, id, slot, false, pending.stream});
  } else if (enqueued == 0) {
    s.slots.Release(slot);
    s.api->event_destroy(done);
  }  // else: queued kernels of unknown end keep the slot for the group's life
  return first;
}

class CudaBackend : public CollectiveBackend {
 public:
  explicit CudaBackend(int device, std::unique_ptr<CudaSpanPart> span = nullptr)
      : device_(device), span_(std::move(span)) {}

  // Enqueues `c` on options.cuda_stream (null: the legacy default stream). INVALID_ARGUMENT,
  // synchronously and with nothing enqueued, for what the device path cannot do (a NaN
  // policy of FAIL with the check on, nonfinite_count/nonfinite_ranks outputs, a view the
  // kernels cannot take); ABORTED once the group is aborted; the deferred error of an
  // earlier call.
  absl::Status Run(const CheckedCall& c, CollectiveEntry& entry) override {
    const CollectiveOptions& options = *c.call.options;
    RETURN_IF_ERROR(CheckSupported(entry, options));
    if (span_ != nullptr) return RunSpanning(c, entry);
    return Launch(c, entry, nullptr);
  }

 private:
  // A spanning group's call (cuda_span_collectives.h): the agreement, the plan, then the
  // node-local path's bookkeeping around the plan's steps. A failure once the ranks agreed
  // leaves them out of step: the daemon is asked to abort the group on every node.
  absl::Status RunSpanning(const CheckedCall& c, CollectiveEntry& entry) {
    if (absl::Status agreed = span_->Agree(c); !agreed.ok()) {
      // Recorded and left incomplete, as on host memory: the watchdog sees the mismatch there
      // (a part's part_of entry is the caller's to retire).
      entry.Begin();
      entry.Abandon();
      return agreed;
    }
    ASSIGN_OR_RETURN(const kernels::SpanPlan plan, span_->Plan(c));  // the same on every rank
    absl::Status st = Launch(c, entry, &plan);
    if (!st.ok() && !absl::IsInvalidArgument(st) && !absl::IsAborted(st)) span_->Failed(st);
    return st;
  }

  // One call's bookkeeping on the device: the group's state and context, the deferred errors
  // of earlier calls, the view, the cuBLAS handle of a fused matmul (made before anything of
  // the call is enqueued) and the scratch; then the kernels of `c`, or of a spanning group's
  // `plan` with its NCCL steps.
  absl::Status Launch(const CheckedCall& c, CollectiveEntry& entry, const kernels::SpanPlan* plan) {
    void* stream = c.call.options->cuda_stream;
    if (state_ == nullptr) {
      ASSIGN_OR_RETURN(state_, CreateCudaGroupState(device_, &entry.recorder_impl()));
    }
    CudaGroupState& s = *state_;
    absl::MutexLock lock(&s.mu);
    ContextScope scope(s);
    if (!scope.ok()) return absl::InternalError("cuCtxPushCurrent of the primary context failed");
    RETURN_IF_ERROR(PollCalls(s, entry.group().name()));
    RETURN_IF_ERROR(RefuseCapture(s, entry.group().name(), stream));
    ASSIGN_OR_RETURN(kernels::CudaCommView view, MakeView(entry, c, stream));
    if (plan == nullptr && c.call.matmul != nullptr) {
      RETURN_IF_ERROR(MakeCublasHandle(s, entry.group().name(), stream));
    }
    if (plan == nullptr) {
      ASSIGN_OR_RETURN(void* scratch,
                       StreamScratch(s, reinterpret_cast<uintptr_t>(stream),
                                     ScratchBytes(view, c, s.cublas_workspace_bytes)));
      return Enqueue(s, c, entry, view, scratch);
    }
    SpanLaunch span{.plan = plan,
                    .part = span_.get(),
                    .thresholds = {.one_shot_max_read_bytes = static_cast<size_t>(
                                       entry.settings().one_shot_max_read_bytes())}};
    if (c.call.out != c.call.in && c.out_views != nullptr) {
      ASSIGN_OR_RETURN(span.out, MakeView(entry, c, stream, c.out_views));
    }
    ASSIGN_OR_RETURN(void* scratch,
                     StreamScratch(s, reinterpret_cast<uintptr_t>(stream),
                                   SpanScratchBytes(*plan, view.world_size, span.thresholds)));
    return Enqueue(s, c, entry, view, scratch, span);
  }

  const int device_;
  // Before state_, so destroyed after it: the state's deleter waits for the group's enqueued
  // calls, NCCL's among them, before the span part aborts its communicator.
  std::unique_ptr<CudaSpanPart> span_;
  CudaGroupStatePtr state_;  // made on the first collective; its deleter waits for the calls
};

}  // namespace

std::unique_ptr<CollectiveBackend> MakeCudaBackend(int device) {
  return std::make_unique<CudaBackend>(device);
}

SpanCollectives MakeCudaSpanCollectives(int device, SpanSetup setup) {
  std::unique_ptr<CudaSpanPart> part = MakeCudaSpanPart(std::move(setup));
  CudaSpanPart* raw = part.get();
  return {.backend = std::make_unique<CudaBackend>(device, std::move(part)),
          .close = [raw] { raw->Close(); }};
}

}  // namespace commd
