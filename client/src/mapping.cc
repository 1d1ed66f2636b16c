#include "client/src/mapping.h"

#include "absl/strings/str_cat.h"
#include "common/shm_mapping.h"
#include "common/status_macros.h"

#ifdef COMMD_HAVE_CUDA
#include <cstring>

#include "common/cuda_check.h"
#include "common/cuda_driver_api.h"
#endif

namespace commd {
namespace {

class HostMapping final : public Mapping {
 public:
  explicit HostMapping(SharedMapping m) : m_(std::move(m)) {}
  void* data() const override { return m_.data(); }

 private:
  SharedMapping m_;
};

#ifdef COMMD_HAVE_CUDA
class CuMemMapping final : public Mapping {
 public:
  CuMemMapping(const CudaDriverApi* api, CUmemGenericAllocationHandle h, CUdeviceptr p, size_t n)
      : api_(api), handle_(h), ptr_(p), bytes_(n) {}
  ~CuMemMapping() override {
    api_->mem_unmap(ptr_, bytes_);
    api_->mem_address_free(ptr_, bytes_);
    api_->mem_release(handle_);
  }
  void* data() const override { return reinterpret_cast<void*>(ptr_); }

 private:
  const CudaDriverApi* api_;
  CUmemGenericAllocationHandle handle_;
  CUdeviceptr ptr_;
  size_t bytes_;
};

// A legacy IPC buffer opened in the device's primary context, which the mapping holds.
class IpcMapping final : public Mapping {
 public:
  IpcMapping(const CudaDriverApi* api, CUdevice device, CUcontext ctx, CUdeviceptr p)
      : api_(api), device_(device), ctx_(ctx), ptr_(p) {}
  ~IpcMapping() override {
    if (api_->ctx_push_current(ctx_) == CUDA_SUCCESS) {
      api_->ipc_close_mem_handle(ptr_);
      CUcontext ignored;
      api_->ctx_pop_current(&ignored);
    }
    api_->primary_ctx_release(device_);
  }
  void* data() const override { return reinterpret_cast<void*>(ptr_); }

 private:
  const CudaDriverApi* api_;
  CUdevice device_;
  CUcontext ctx_;
  CUdeviceptr ptr_;
};

absl::StatusOr<std::unique_ptr<Mapping>> OpenIpc(const CudaDriverApi& api,
                                                 const CUipcMemHandle& ipc, int local_device) {
  CUdevice device;
  CU_RETURN_IF_ERROR(api.device_get(&device, local_device));
  CUcontext ctx = nullptr;
  CU_RETURN_IF_ERROR(api.primary_ctx_retain(&ctx, device));
  CUresult r = api.ctx_push_current(ctx);
  CUdeviceptr ptr = 0;
  if (r == CUDA_SUCCESS) {
    r = api.ipc_open_mem_handle(&ptr, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    CUcontext ignored;
    api.ctx_pop_current(&ignored);
  }
  if (r != CUDA_SUCCESS) {
    api.primary_ctx_release(device);
    return absl::InternalError(
        absl::StrCat("cuIpcOpenMemHandle on cuda:", local_device, ": ", CuErrorText(r)));
  }
  return std::make_unique<IpcMapping>(&api, device, ctx, ptr);
}

absl::StatusOr<std::unique_ptr<Mapping>> MapCuMem(const CudaDriverApi& api, int fd, size_t bytes,
                                                  int device) {
  CUmemGenericAllocationHandle handle;
  CU_RETURN_IF_ERROR(api.mem_import_from_shareable_handle(
      &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUdeviceptr ptr = 0;
  if (CUresult r = api.mem_address_reserve(&ptr, bytes, 0, 0, 0); r != CUDA_SUCCESS) {
    api.mem_release(handle);
    return absl::InternalError(absl::StrCat("cuMemAddressReserve: ", CuErrorText(r)));
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult r = api.mem_map(ptr, bytes, 0, handle, 0);
  if (r == CUDA_SUCCESS) r = api.mem_set_access(ptr, bytes, &access, 1);
  if (r != CUDA_SUCCESS) {
    api.mem_unmap(ptr, bytes);
    api.mem_address_free(ptr, bytes);
    api.mem_release(handle);
    return absl::InternalError(absl::StrCat("mapping a CUDA buffer: ", CuErrorText(r)));
  }
  return std::make_unique<CuMemMapping>(&api, handle, ptr, bytes);
}
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<Mapping>> MapHostBuffer(const UniqueFd& fd, size_t bytes) {
  ASSIGN_OR_RETURN(SharedMapping m, SharedMapping::Map(fd.get(), bytes));
  return std::make_unique<HostMapping>(std::move(m));
}

absl::StatusOr<std::unique_ptr<Mapping>> MapCudaBuffer(const v1::BufferHandle& handle, UniqueFd fd,
                                                       int local_device) {
#ifdef COMMD_HAVE_CUDA
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  if (fd.valid()) return MapCuMem(*api, fd.get(), handle.mapped_bytes(), local_device);
  CUipcMemHandle ipc;
  if (handle.opaque_handle().size() != sizeof(ipc)) {
    return absl::InternalError(absl::StrCat("CUDA buffer of rank ", handle.rank(),
                                            " came with neither an fd nor a legacy IPC handle"));
  }
  std::memcpy(&ipc, handle.opaque_handle().data(), sizeof(ipc));
  return OpenIpc(*api, ipc, local_device);
#else
  return absl::UnimplementedError(
      absl::StrCat("buffer on ", handle.device(), ": this SDK was built without CUDA"));
#endif
}

}  // namespace commd
