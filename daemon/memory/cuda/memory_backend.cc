#include "daemon/memory/cuda/memory_backend.h"

#include <fcntl.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_check.h"
#include "common/cuda_driver.h"
#include "common/cuda_driver_api.h"
#include "common/status_macros.h"

namespace commd::memory {
namespace {

class CudaMemoryBackend final : public MemoryBackend {
 public:
  CudaMemoryBackend(const CudaDriverApi* cu, int devices)
      : cu_(cu), devices_(devices), legacy_contexts_(devices, nullptr) {}
  ~CudaMemoryBackend() override {
    absl::MutexLock lock(&legacy_mu_);
    for (int i = 0; i < devices_; ++i) {
      CUdevice dev;
      if (legacy_contexts_[i] != nullptr && cu_->device_get(&dev, i) == CUDA_SUCCESS) {
        cu_->primary_ctx_release(dev);
      }
    }
  }

  absl::string_view name() const override { return "cuda"; }

  absl::StatusOr<MemoryBlock> Allocate(const Device& device, size_t bytes,
                                       absl::string_view label) override {
    if (device.kind != Device::Kind::kCuda || device.index >= devices_) {
      return absl::InvalidArgumentError(absl::StrCat("device ", device.ToString(),
                                                     " is not one of this node's ", devices_,
                                                     " CUDA device(s)"));
    }
    if (bytes == 0) return absl::InvalidArgumentError("CUDA allocation of 0 bytes");
    CUdevice dev;
    CU_RETURN_IF_ERROR(cu_->device_get(&dev, device.index));
    int vmm = 0;
    CU_RETURN_IF_ERROR(cu_->device_get_attribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    if (!vmm) return LegacyAllocate(device, dev, bytes);
    return CuMemAllocate(device, dev, bytes);
  }

  absl::StatusOr<ExportedMemory> Export(const MemoryBlock& block) override {
    ExportedMemory out;
    if (block.fd.valid()) {
      SYS_ASSIGN_OR_RETURN(int dup, ::fcntl(block.fd.get(), F_DUPFD_CLOEXEC, 0));
      out.fd.reset(dup);
    }
    out.opaque_handle = block.opaque_handle;
    return out;
  }

  void Release(MemoryBlock block) override {
    block.fd.reset();
    if (block.handle != 0) {
      cu_->mem_release(static_cast<CUmemGenericAllocationHandle>(block.handle));
    } else if (block.device_pointer != 0) {
      absl::MutexLock lock(&legacy_mu_);
      CUcontext ctx = legacy_contexts_[block.device.index];
      if (ctx != nullptr && cu_->ctx_push_current(ctx) == CUDA_SUCCESS) {
        cu_->mem_free(static_cast<CUdeviceptr>(block.device_pointer));
        cu_->ctx_pop_current(&ctx);
      }
    }
  }

 private:
  absl::StatusOr<MemoryBlock> CuMemAllocate(const Device& device, CUdevice dev, size_t bytes) {
    int fabric = 0;
    // Drivers before 12.3 do not know the attribute (CUDA_ERROR_INVALID_VALUE): no fabric.
    if (cu_->device_get_attribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev) !=
        CUDA_SUCCESS) {
      fabric = 0;
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device.index;
    prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | (fabric ? CU_MEM_HANDLE_TYPE_FABRIC : 0));
    size_t granularity = 0;
    CU_RETURN_IF_ERROR(cu_->mem_get_allocation_granularity(&granularity, &prop,
                                                           CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t rounded = (bytes + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle;
    CU_RETURN_IF_ERROR(cu_->mem_create(&handle, rounded, &prop, 0));
    MemoryBlock block;
    block.device = device;
    block.bytes = rounded;
    block.handle = handle;
    int fd = -1;
    if (CUresult r = cu_->mem_export_to_shareable_handle(
            &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS) {
      cu_->mem_release(handle);
      return absl::InternalError(
          absl::StrCat("cuMemExportToShareableHandle(POSIX fd): ", CuErrorText(r)));
    }
    block.fd.reset(fd);
    if (fabric) {
      CUmemFabricHandle fh;
      if (cu_->mem_export_to_shareable_handle(&fh, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0) ==
          CUDA_SUCCESS) {
        block.opaque_handle.assign(reinterpret_cast<const char*>(&fh), sizeof(fh));
      }
    }
    return block;
  }

  // Devices without VMM: a cuMemAlloc'd buffer in the device's primary context (retained
  // on first use until the backend goes), shared through a legacy IPC handle (64 bytes that
  // travel in the gRPC answer; no fd).
  absl::StatusOr<MemoryBlock> LegacyAllocate(const Device& device, CUdevice dev, size_t bytes) {
    absl::MutexLock lock(&legacy_mu_);
    CUcontext& ctx = legacy_contexts_[device.index];
    if (ctx == nullptr) CU_RETURN_IF_ERROR(cu_->primary_ctx_retain(&ctx, dev));
    CU_RETURN_IF_ERROR(cu_->ctx_push_current(ctx));
    CUdeviceptr ptr = 0;
    CUipcMemHandle ipc;
    CUresult r = cu_->mem_alloc(&ptr, bytes);
    if (r == CUDA_SUCCESS) {
      r = cu_->ipc_get_mem_handle(&ipc, ptr);
      if (r != CUDA_SUCCESS) cu_->mem_free(ptr);
    }
    CUcontext ignored;
    cu_->ctx_pop_current(&ignored);
    if (r != CUDA_SUCCESS) {
      return CudaError(r == CUDA_ERROR_OUT_OF_MEMORY,
                       absl::StrCat("cuMemAlloc + cuIpcGetMemHandle of ", bytes, " bytes on ",
                                    device.ToString(), ": ", CuErrorText(r)),
                       __FILE__, __LINE__);
    }
    MemoryBlock block;
    block.device = device;
    block.bytes = bytes;
    block.device_pointer = ptr;
    block.opaque_handle.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
    return block;
  }

  const CudaDriverApi* const cu_;
  const int devices_;
  absl::Mutex legacy_mu_;
  std::vector<CUcontext> legacy_contexts_ ABSL_GUARDED_BY(legacy_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend() {
  const CudaDriverInfo& info = ProbeCudaDriver();
  if (!info.available) return absl::UnavailableError(info.summary);
  ASSIGN_OR_RETURN(const CudaDriverApi* cu, CudaDriver());
  return std::make_unique<CudaMemoryBackend>(cu, info.device_count);
}

}  // namespace commd::memory
