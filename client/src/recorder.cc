#include "commd/recorder.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "client/src/recorder_impl.h"
#include "common/cuda_driver.h"
#include "common/status_macros.h"

#ifdef COMMD_HAVE_CUDA
#include "common/cuda_check.h"
#include "common/cuda_driver_api.h"
#endif

namespace commd {
namespace {

// Copies without allocating (at most kRecordMaxTensors are recorded per side anyway); a
// dtype outside the vocabulary is recorded as float32, so that the ring holds only codes its
// readers know.
size_t Convert(std::span<const TensorDesc> in, std::array<TensorDesc, kRecordMaxTensors>* out) {
  const size_t n = std::min<size_t>(in.size(), kRecordMaxTensors);
  for (size_t i = 0; i < n; ++i) {
    (*out)[i] = in[i];
    if (!IsValid(in[i].dtype)) (*out)[i].dtype = DataType::kFloat32;
  }
  return n;
}

RecordHandle ToHandle(const RecordId& id) { return Recorder::Impl::Handle(id); }

constexpr uint64_t kStartedWord =
    kProgressOffset + offsetof(ControlBlockProgress, last_started_seq);
constexpr uint64_t kCompletedWord =
    kProgressOffset + offsetof(ControlBlockProgress, last_completed_seq);

// Whether a stream-ordered call with this stream takes the CPU path instead.
bool CpuPath(void* cuda_stream) { return cuda_stream == nullptr && !ProbeCudaDriver().available; }

absl::Status NoCuda(void* cuda_stream) {
  return absl::FailedPreconditionError(
      absl::StrCat("stream-ordered recording on stream ", absl::Hex(cuda_stream),
                   " needs a CUDA build and driver (", ProbeCudaDriver().summary,
                   "); a null stream without CUDA records on the CPU"));
}

}  // namespace

Recorder::Recorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recorder::~Recorder() = default;

// The public call's tensor descriptors converted on the stack (the SDK's own collectives
// build the ring's form directly: CollectiveEntry).
RecordId Recorder::Begin(CollectiveOp op, std::span<const TensorDesc> inputs,
                         std::span<const TensorDesc> outputs, int peer, uint64_t timeout_ms) {
  std::array<TensorDesc, kRecordMaxTensors> in{}, out{};
  const size_t n_in = Convert(inputs, &in);
  const size_t n_out = Convert(outputs, &out);
  const RecordHandle h = impl_->writer->Begin({.op = op,
                                               .inputs = {in.data(), n_in},
                                               .outputs = {out.data(), n_out},
                                               .peer = peer,
                                               .timeout_ms = timeout_ms});
  return RecordId{h.record_id, h.collective_seq_id, h.bytes, static_cast<int>(h.op)};
}

#ifdef COMMD_HAVE_CUDA
// Stream writes into the block may still be queued: they are waited for in the context they
// were registered in (made current here: the destroying thread may have none) before the
// block is unregistered and later unmapped under them.
Recorder::Impl::~Impl() {
  if (!registered_) return;
  auto api = CudaDriver();
  if (!api.ok()) return;
  const bool pushed = (*api)->ctx_push_current(static_cast<CUcontext>(context_)) == CUDA_SUCCESS;
  if (pushed) (*api)->ctx_synchronize();
  (*api)->mem_host_unregister(block);
  CUcontext ignored;
  if (pushed) (*api)->ctx_pop_current(&ignored);
}

absl::StatusOr<uint64_t> Recorder::Impl::DeviceAddress(void* cuda_stream, uint64_t offset) {
  if (!ProbeCudaDriver().available) return NoCuda(cuda_stream);
  if (!registered_ && registration_.ok()) {
    registration_ = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
      CUcontext ctx = nullptr;
      CU_RETURN_IF_ERROR(api->stream_get_ctx(static_cast<CUstream>(cuda_stream), &ctx));
      CU_RETURN_IF_ERROR(api->ctx_push_current(ctx));
      // cuStreamWriteValue64 fails on devices that cannot use 64-bit stream memory
      // operations; say so once, here, instead of at every write.
      CUdevice device = 0;
      int memops64 = 0;
      CUresult r = api->ctx_get_device(&device);
      if (r == CUDA_SUCCESS) {
        r = api->device_get_attribute(&memops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                      device);
      }
      if (r != CUDA_SUCCESS || !memops64) {
        api->ctx_pop_current(&ctx);
        CU_RETURN_IF_ERROR(r);
        return absl::FailedPreconditionError(absl::StrCat(
            "the flight recorder's stream-ordered writes need 64-bit stream memory operations, "
            "which cuda:",
            device, " cannot use (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0)"));
      }
      // Only the first page: it holds the progress words, and pinning the whole ring would
      // lock up to ~54 MiB per group.
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      r = api->mem_host_register(block, std::min(page, block_bytes),
                                 CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
      CUdeviceptr base = 0;
      if (r == CUDA_SUCCESS) {
        registered_ = true;
        context_ = ctx;
        r = api->mem_host_get_device_pointer(&base, block, 0);
      }
      api->ctx_pop_current(&ctx);
      CU_RETURN_IF_ERROR(r);
      device_base_ = base;
      return absl::OkStatus();
    }();
  }
  RETURN_IF_ERROR(registration_);
  return device_base_ + offset;
}

absl::Status Recorder::Impl::WriteOnStream(void* cuda_stream, uint64_t offset, uint64_t value) {
  ASSIGN_OR_RETURN(const uint64_t address, DeviceAddress(cuda_stream, offset));
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  // Default flags: the write is ordered after the stream's earlier work and its writes.
  CU_RETURN_IF_ERROR(api->stream_write_value64(static_cast<CUstream>(cuda_stream), address, value,
                                               CU_STREAM_WRITE_VALUE_DEFAULT));
  return absl::OkStatus();
}
#else
Recorder::Impl::~Impl() = default;

absl::StatusOr<uint64_t> Recorder::Impl::DeviceAddress(void* cuda_stream, uint64_t) {
  return NoCuda(cuda_stream);
}

absl::Status Recorder::Impl::WriteOnStream(void* cuda_stream, uint64_t, uint64_t) {
  return NoCuda(cuda_stream);
}
#endif

namespace {

// Enqueues the write of `id`'s sequence id into the progress word at `word`. p2p entries have
// no collective sequence id and move no progress word; they still need the block registered,
// so that a stream without CUDA fails the same way.
absl::Status EnqueueProgress(Recorder::Impl& impl, void* cuda_stream, uint64_t word,
                             const RecordId& id) {
  if (id.collective_seq_id != 0) {
    return impl.WriteOnStream(cuda_stream, word, id.collective_seq_id);
  }
  return impl.DeviceAddress(cuda_stream, word).status();
}

}  // namespace

absl::Status Recorder::Started(const RecordId& id, void* cuda_stream) {
  if (CpuPath(cuda_stream)) {
    Started(id);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(EnqueueProgress(*impl_, cuda_stream, kStartedWord, id));
  impl_->writer->StartedExceptProgress(ToHandle(id));
  return absl::OkStatus();
}

absl::Status Recorder::Completed(const RecordId& id, void* cuda_stream) {
  if (CpuPath(cuda_stream)) {
    Completed(id);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(EnqueueProgress(*impl_, cuda_stream, kCompletedWord, id));
  impl_->writer->CompletedExceptProgress(ToHandle(id));
  return absl::OkStatus();
}

void Recorder::Started(const RecordId& id) { impl_->writer->Started(ToHandle(id)); }
void Recorder::Completed(const RecordId& id) { impl_->writer->Completed(ToHandle(id)); }
void Recorder::Abandoned(const RecordId& id) { impl_->writer->Abandon(ToHandle(id)); }
void Recorder::Heartbeat() { impl_->writer->Heartbeat(); }

}  // namespace commd
