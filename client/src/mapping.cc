#include "client/src/mapping.h"

#include "absl/strings/str_cat.h"
#include "common/shm_mapping.h"
#include "common/status_macros.h"

#ifdef COMMD_HAVE_CUDA
#include <cstring>

#include "common/cuda_check.h"
#include "common/cuda_driver.h"
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
struct CuMemApi {
  decltype(&cuMemImportFromShareableHandle) import = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemRelease) release = nullptr;
};

absl::StatusOr<const CuMemApi*> Api() {
  static const absl::StatusOr<CuMemApi> api = []() -> absl::StatusOr<CuMemApi> {
    CuMemApi a;
    const absl::Status resolved = ResolveDriverFunctions({
        {"cuMemImportFromShareableHandle", reinterpret_cast<void**>(&a.import)},
        {"cuMemAddressReserve", reinterpret_cast<void**>(&a.reserve)},
        {"cuMemMap", reinterpret_cast<void**>(&a.map)},
        {"cuMemSetAccess", reinterpret_cast<void**>(&a.set_access)},
        {"cuMemUnmap", reinterpret_cast<void**>(&a.unmap)},
        {"cuMemAddressFree", reinterpret_cast<void**>(&a.address_free)},
        {"cuMemRelease", reinterpret_cast<void**>(&a.release)},
    });
    if (!resolved.ok()) return resolved;
    return a;
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

class CuMemMapping final : public Mapping {
 public:
  CuMemMapping(const CuMemApi* api, CUmemGenericAllocationHandle h, CUdeviceptr p, size_t n)
      : api_(api), handle_(h), ptr_(p), bytes_(n) {}
  ~CuMemMapping() override {
    api_->unmap(ptr_, bytes_);
    api_->address_free(ptr_, bytes_);
    api_->release(handle_);
  }
  void* data() const override { return reinterpret_cast<void*>(ptr_); }

 private:
  const CuMemApi* api_;
  CUmemGenericAllocationHandle handle_;
  CUdeviceptr ptr_;
  size_t bytes_;
};

class IpcMapping final : public Mapping {
 public:
  explicit IpcMapping(void* p) : ptr_(p) {}
  ~IpcMapping() override { cudaIpcCloseMemHandle(ptr_); }
  void* data() const override { return ptr_; }

 private:
  void* ptr_;
};

absl::StatusOr<std::unique_ptr<Mapping>> MapCuMem(const CuMemApi& api, int fd, size_t bytes,
                                                  int device) {
  CUmemGenericAllocationHandle handle;
  CU_RETURN_IF_ERROR(api.import(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUdeviceptr ptr = 0;
  if (CUresult r = api.reserve(&ptr, bytes, 0, 0, 0); r != CUDA_SUCCESS) {
    api.release(handle);
    return absl::InternalError(absl::StrCat("cuMemAddressReserve: ", CuErrorText(r)));
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult r = api.map(ptr, bytes, 0, handle, 0);
  if (r == CUDA_SUCCESS) r = api.set_access(ptr, bytes, &access, 1);
  if (r != CUDA_SUCCESS) {
    api.unmap(ptr, bytes);
    api.address_free(ptr, bytes);
    api.release(handle);
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
  if (fd.valid()) {
    ASSIGN_OR_RETURN(const CuMemApi* api, Api());
    return MapCuMem(*api, fd.get(), handle.mapped_bytes(), local_device);
  }
  cudaIpcMemHandle_t ipc;
  if (handle.opaque_handle().size() != sizeof(ipc)) {
    return absl::InternalError(absl::StrCat("CUDA buffer of rank ", handle.rank(),
                                            " came with neither an fd nor a legacy IPC handle"));
  }
  std::memcpy(&ipc, handle.opaque_handle().data(), sizeof(ipc));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(local_device));
  void* ptr = nullptr;
  CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&ptr, ipc, cudaIpcMemLazyEnablePeerAccess));
  return std::make_unique<IpcMapping>(ptr);
#else
  return absl::UnimplementedError(
      absl::StrCat("buffer on ", handle.device(), ": this SDK was built without CUDA"));
#endif
}

}  // namespace commd
