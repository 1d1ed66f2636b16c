#include "daemon/memory/cuda/memory_backend.h"

#include <fcntl.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_check.h"
#include "common/cuda_driver.h"
#include "common/cuda_driver_api.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace commd::memory {
namespace {

// What the backend keeps per device: the primary context it zeroes (and, without VMM,
// allocates) in, retained on first use until the backend goes, and whether fabric handles
// turned out not to be permitted.
struct DeviceState {
  CUcontext ctx = nullptr;
  bool fabric_refused = false;
};

class CudaMemoryBackend final : public MemoryBackend {
 public:
  CudaMemoryBackend(const CudaDriverApi* cu, int devices)
      : cu_(cu), devices_(devices), states_(devices) {}
  ~CudaMemoryBackend() override {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < devices_; ++i) {
      CUdevice dev;
      if (states_[i].ctx != nullptr && cu_->device_get(&dev, i) == CUDA_SUCCESS) {
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
    ASSIGN_OR_RETURN(CUcontext ctx, Context(device.index, dev));
    int vmm = 0;
    CU_RETURN_IF_ERROR(cu_->device_get_attribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    if (!vmm) return LegacyAllocate(device, ctx, bytes);
    return CuMemAllocate(device, dev, ctx, bytes);
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
      CUcontext ctx = ExistingContext(block.device.index);
      if (ctx != nullptr && cu_->ctx_push_current(ctx) == CUDA_SUCCESS) {
        cu_->mem_free(static_cast<CUdeviceptr>(block.device_pointer));
        cu_->ctx_pop_current(&ctx);
      }
    }
  }

  absl::StatusOr<Device> DeviceByUuid(absl::string_view uuid) const override {
    std::vector<std::string> seen;
    for (int i = 0; i < devices_; ++i) {
      CUdevice dev;
      CUuuid id;
      CUresult r = cu_->device_get(&dev, i);
      if (r == CUDA_SUCCESS) r = cu_->device_get_uuid(&id, dev);
      if (r != CUDA_SUCCESS) {
        seen.push_back(absl::StrCat("cuda:", i, " unreadable: ", CuErrorText(r)));
        continue;
      }
      seen.push_back(CudaUuidText(id));
      if (seen.back() == uuid) return Device::Cuda(i);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", uuid, " is not one of the CUDA devices commd sees (", absl::StrJoin(seen, ", "),
        "); commd must see every GPU its clients use: start it without a CUDA_VISIBLE_DEVICES "
        "that hides this one"));
  }

 private:
  // The device's primary context, retained on first use.
  absl::StatusOr<CUcontext> Context(int index, CUdevice dev) {
    absl::MutexLock lock(&mu_);
    CUcontext& ctx = states_[index].ctx;
    if (ctx == nullptr) CU_RETURN_IF_ERROR(cu_->primary_ctx_retain(&ctx, dev));
    return ctx;
  }
  CUcontext ExistingContext(int index) {
    absl::MutexLock lock(&mu_);
    return states_[index].ctx;
  }

  // Handle types to ask for: POSIX fds always (the SDK imports those), fabric handles too
  // where the device supports them and they have not been refused before.
  CUmemAllocationHandleType HandleTypes(int index, CUdevice dev) {
    int fabric = 0;
    // Drivers before 12.3 do not know the attribute (CUDA_ERROR_INVALID_VALUE): no fabric.
    if (cu_->device_get_attribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev) !=
        CUDA_SUCCESS) {
      fabric = 0;
    }
    absl::MutexLock lock(&mu_);
    return static_cast<CUmemAllocationHandleType>(
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
        (fabric && !states_[index].fabric_refused ? CU_MEM_HANDLE_TYPE_FABRIC : 0));
  }

  // cuMemCreate; when fabric handles are refused (NVSwitch nodes without an IMEX channel
  // answer CUDA_ERROR_NOT_PERMITTED, older setups CUDA_ERROR_NOT_SUPPORTED) asks again for
  // POSIX fds only, as NCCL's allocator does, and stops asking for fabric on that device.
  CUresult Create(const Device& device, CUmemAllocationProp& prop, size_t bytes,
                  CUmemGenericAllocationHandle* handle) {
    CUresult r = cu_->mem_create(handle, bytes, &prop, 0);
    if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) == 0 ||
        (r != CUDA_ERROR_NOT_PERMITTED && r != CUDA_ERROR_NOT_SUPPORTED)) {
      return r;
    }
    {
      absl::MutexLock lock(&mu_);
      states_[device.index].fabric_refused = true;
    }
    COMMD_LOG(WARNING, "memory")
        << device.ToString() << " supports fabric handles but cuMemCreate with one failed ("
        << CuErrorText(r)
        << "; no IMEX channel?): allocating with POSIX fd handles only, which serve every "
           "process on this node; multi-node NVLink sharing needs IMEX";
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return cu_->mem_create(handle, bytes, &prop, 0);
  }

  absl::StatusOr<MemoryBlock> CuMemAllocate(const Device& device, CUdevice dev, CUcontext ctx,
                                            size_t bytes) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device.index;
    prop.requestedHandleTypes = HandleTypes(device.index, dev);
    size_t granularity = 0;
    CU_RETURN_IF_ERROR(cu_->mem_get_allocation_granularity(&granularity, &prop,
                                                           CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t rounded = (bytes + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle;
    if (CUresult r = Create(device, prop, rounded, &handle); r != CUDA_SUCCESS) {
      return CudaError(r == CUDA_ERROR_OUT_OF_MEMORY,
                       absl::StrCat("cuMemCreate of ", rounded, " bytes on ", device.ToString(),
                                    ": ", CuErrorText(r)),
                       __FILE__, __LINE__);
    }
    MemoryBlock block;
    block.device = device;
    block.bytes = rounded;
    block.handle = handle;
    if (absl::Status s = Zero(device, ctx, handle, rounded); !s.ok()) {
      cu_->mem_release(handle);
      return s;
    }
    int fd = -1;
    if (CUresult r = cu_->mem_export_to_shareable_handle(
            &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS) {
      cu_->mem_release(handle);
      return absl::InternalError(
          absl::StrCat("cuMemExportToShareableHandle(POSIX fd): ", CuErrorText(r)));
    }
    block.fd.reset(fd);
    if (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) {
      CUmemFabricHandle fh;
      if (cu_->mem_export_to_shareable_handle(&fh, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0) ==
          CUDA_SUCCESS) {
        block.opaque_handle.assign(reinterpret_cast<const char*>(&fh), sizeof(fh));
        block.opaque_kind = MemoryBlock::OpaqueKind::kFabric;
      }
    }
    return block;
  }

  // Zeroes a fresh allocation before any client sees it: neither cuMemCreate nor cuMemAlloc
  // promises zeros, a long-running daemon recycles physical memory, and kernels/
  // signal_layout.h needs zero pads (garbage in a counter hangs peers or lets a barrier pass
  // early) while the data must not carry one job's bytes into the next. Maps the allocation
  // here only for the memset, synchronised before it is unmapped.
  absl::Status Zero(const Device& device, CUcontext ctx, CUmemGenericAllocationHandle handle,
                    size_t bytes) {
    CUdeviceptr ptr = 0;
    CU_RETURN_IF_ERROR(cu_->mem_address_reserve(&ptr, bytes, 0, 0, 0));
    CUresult r = cu_->mem_map(ptr, bytes, 0, handle, 0);
    const bool mapped = r == CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device.index;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = cu_->mem_set_access(ptr, bytes, &access, 1);
    }
    if (r == CUDA_SUCCESS) r = MemsetZero(ctx, ptr, bytes);
    if (mapped) cu_->mem_unmap(ptr, bytes);
    cu_->mem_address_free(ptr, bytes);
    if (r != CUDA_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("zeroing ", bytes, " bytes on ", device.ToString(), ": ", CuErrorText(r)));
    }
    return absl::OkStatus();
  }

  // cuMemsetD8 in `ctx`, waited for (it is asynchronous to the host for device memory).
  CUresult MemsetZero(CUcontext ctx, CUdeviceptr ptr, size_t bytes) {
    CUresult r = cu_->ctx_push_current(ctx);
    if (r != CUDA_SUCCESS) return r;
    r = cu_->memset_d8(ptr, 0, bytes);
    if (r == CUDA_SUCCESS) r = cu_->ctx_synchronize();
    CUcontext ignored;
    cu_->ctx_pop_current(&ignored);
    return r;
  }

  // Devices without VMM: a cuMemAlloc'd buffer in the device's primary context, zeroed, and
  // shared through a legacy IPC handle (64 bytes that travel in the gRPC answer; no fd).
  absl::StatusOr<MemoryBlock> LegacyAllocate(const Device& device, CUcontext ctx, size_t bytes) {
    CU_RETURN_IF_ERROR(cu_->ctx_push_current(ctx));
    CUdeviceptr ptr = 0;
    CUipcMemHandle ipc;
    CUresult r = cu_->mem_alloc(&ptr, bytes);
    if (r == CUDA_SUCCESS) {
      r = cu_->memset_d8(ptr, 0, bytes);
      if (r == CUDA_SUCCESS) r = cu_->ctx_synchronize();
      if (r == CUDA_SUCCESS) r = cu_->ipc_get_mem_handle(&ipc, ptr);
      if (r != CUDA_SUCCESS) cu_->mem_free(ptr);
    }
    CUcontext ignored;
    cu_->ctx_pop_current(&ignored);
    if (r != CUDA_SUCCESS) {
      return CudaError(r == CUDA_ERROR_OUT_OF_MEMORY,
                       absl::StrCat("cuMemAlloc + cuMemsetD8 + cuIpcGetMemHandle of ", bytes,
                                    " bytes on ", device.ToString(), ": ", CuErrorText(r)),
                       __FILE__, __LINE__);
    }
    MemoryBlock block;
    block.device = device;
    block.bytes = bytes;
    block.device_pointer = ptr;
    block.opaque_handle.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
    block.opaque_kind = MemoryBlock::OpaqueKind::kLegacyIpc;
    return block;
  }

  const CudaDriverApi* const cu_;
  const int devices_;
  absl::Mutex mu_;
  std::vector<DeviceState> states_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend() {
  const CudaDriverInfo& info = ProbeCudaDriver();
  if (!info.available) return absl::UnavailableError(info.summary);
  ASSIGN_OR_RETURN(const CudaDriverApi* cu, CudaDriver());
  return std::make_unique<CudaMemoryBackend>(cu, info.device_count);
}

}  // namespace commd::memory
