#include "client/src/mapping.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/shm_mapping.h"
#include "common/status_macros.h"

#ifdef COMMD_HAVE_CUDA
#include <cstring>
#include <vector>

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
// A device buffer at `ptr` in the device's primary context, which the mapping holds until it
// is destroyed (after the subclass's destructor has released the buffer in it).
class PrimaryContextMapping : public Mapping {
 public:
  void* data() const override { return reinterpret_cast<void*>(ptr_); }

 protected:
  PrimaryContextMapping(const CudaDriverApi* api, CUdevice device, CUcontext ctx, CUdeviceptr p)
      : api_(api), device_(device), ctx_(ctx), ptr_(p) {}
  ~PrimaryContextMapping() override { api_->primary_ctx_release(device_); }

  // Makes the context current for a release on this thread (which may have none); false when
  // it cannot be made current.
  bool PushContext() const { return api_->ctx_push_current(ctx_) == CUDA_SUCCESS; }
  void PopContext() const {
    CUcontext ignored;
    api_->ctx_pop_current(&ignored);
  }

  const CudaDriverApi* const api_;
  const CUdevice device_;
  const CUcontext ctx_;
  const CUdeviceptr ptr_;
};

// A cuMem buffer: work queued on it (a collective still running) is waited for before the
// memory is unmapped under it.
class CuMemMapping final : public PrimaryContextMapping {
 public:
  CuMemMapping(const CudaDriverApi* api, CUdevice device, CUcontext ctx,
               CUmemGenericAllocationHandle h, CUdeviceptr p, size_t n)
      : PrimaryContextMapping(api, device, ctx, p), handle_(h), bytes_(n) {}
  ~CuMemMapping() override {
    const bool pushed = PushContext();
    if (pushed) api_->ctx_synchronize();
    api_->mem_unmap(ptr_, bytes_);
    api_->mem_address_free(ptr_, bytes_);
    api_->mem_release(handle_);
    if (pushed) PopContext();
  }

 private:
  const CUmemGenericAllocationHandle handle_;
  const size_t bytes_;
};

// A legacy IPC buffer.
class IpcMapping final : public PrimaryContextMapping {
 public:
  IpcMapping(const CudaDriverApi* api, CUdevice device, CUcontext ctx, CUdeviceptr p)
      : PrimaryContextMapping(api, device, ctx, p) {}
  ~IpcMapping() override {
    if (PushContext()) {
      api_->ipc_close_mem_handle(ptr_);
      PopContext();
    }
  }
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

// Imports, reserves, maps and grants access with the device's primary context current (and
// retained for the mapping's life), so the mapping does not depend on whatever context the
// calling thread happens to have.
absl::StatusOr<std::unique_ptr<Mapping>> MapCuMem(const CudaDriverApi& api, int fd, size_t bytes,
                                                  int local_device) {
  CUdevice device;
  CU_RETURN_IF_ERROR(api.device_get(&device, local_device));
  CUcontext ctx = nullptr;
  CU_RETURN_IF_ERROR(api.primary_ctx_retain(&ctx, device));
  if (CUresult r = api.ctx_push_current(ctx); r != CUDA_SUCCESS) {
    api.primary_ctx_release(device);
    return absl::InternalError(
        absl::StrCat("cuCtxPushCurrent on cuda:", local_device, ": ", CuErrorText(r)));
  }
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;
  bool reserved = false, mapped = false;
  CUresult r = api.mem_import_from_shareable_handle(
      &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r == CUDA_SUCCESS) {
    r = api.mem_address_reserve(&ptr, bytes, 0, 0, 0);
    reserved = r == CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) {
    r = api.mem_map(ptr, bytes, 0, handle, 0);
    mapped = r == CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = local_device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = api.mem_set_access(ptr, bytes, &access, 1);
  }
  CUcontext ignored;
  api.ctx_pop_current(&ignored);
  if (r == CUDA_SUCCESS)
    return std::make_unique<CuMemMapping>(&api, device, ctx, handle, ptr, bytes);
  if (mapped) api.mem_unmap(ptr, bytes);
  if (reserved) api.mem_address_free(ptr, bytes);
  if (handle != 0) api.mem_release(handle);
  api.primary_ctx_release(device);
  return absl::InternalError(
      absl::StrCat("mapping a CUDA buffer on cuda:", local_device, ": ", CuErrorText(r)));
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
  // A fabric handle is 64 bytes like a legacy IPC one; opening it as IPC would fail obscurely
  // or worse. Daemons before opaque_handle_kind sent 64 bytes without an fd only for IPC.
  CUipcMemHandle ipc;
  const bool legacy_ipc = handle.opaque_handle_kind() == v1::OPAQUE_HANDLE_LEGACY_IPC ||
                          handle.opaque_handle_kind() == v1::OPAQUE_HANDLE_NONE;
  if (!legacy_ipc || handle.opaque_handle().size() != sizeof(ipc)) {
    return absl::InternalError(absl::StrCat(
        "CUDA buffer of rank ", handle.rank(), " on ", handle.device(),
        " came with neither an fd nor a legacy IPC handle (opaque handle: ",
        v1::OpaqueHandleKind_Name(handle.opaque_handle_kind()), ", ", handle.opaque_handle().size(),
        " bytes); this SDK imports POSIX fds and legacy IPC"));
  }
  std::memcpy(&ipc, handle.opaque_handle().data(), sizeof(ipc));
  return OpenIpc(*api, ipc, local_device);
#else
  return absl::UnimplementedError(
      absl::StrCat("buffer on ", handle.device(), ": this SDK was built without CUDA"));
#endif
}

absl::StatusOr<std::string> CudaDeviceUuid(int local_device) {
#ifdef COMMD_HAVE_CUDA
  if (local_device < 0) return "";  // host: no driver loaded for it
  auto api = CudaDriver();
  if (!api.ok()) return "";
  CUdevice device;
  CUuuid uuid;
  CUresult r = (*api)->device_get(&device, local_device);
  if (r == CUDA_SUCCESS) r = (*api)->device_get_uuid(&uuid, device);
  if (r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot name this process's device cuda:", local_device,
                     " (cuDeviceGet + cuDeviceGetUuid: ", CuErrorText(r),
                     "); CUDA_VISIBLE_DEVICES decides which GPUs a process sees"));
  }
  return CudaUuidText(uuid);
#else
  return "";
#endif
}

absl::StatusOr<int> CudaOrdinalOfUuid(const std::string& uuid, int fallback,
                                      const std::string& what) {
  if (uuid.empty()) return fallback;
#ifdef COMMD_HAVE_CUDA
  ASSIGN_OR_RETURN(const CudaDriverApi* api, CudaDriver());
  int count = 0;
  if (CUresult r = api->device_get_count(&count); r != CUDA_SUCCESS) count = 0;
  std::vector<std::string> seen;
  for (int i = 0; i < count; ++i) {
    CUdevice device;
    CUuuid id;
    if (api->device_get(&device, i) != CUDA_SUCCESS ||
        api->device_get_uuid(&id, device) != CUDA_SUCCESS) {
      seen.push_back(absl::StrCat("cuda:", i, " unreadable"));
      continue;
    }
    if (CudaUuidText(id) == uuid) return i;
    seen.push_back(CudaUuidText(id));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, " lives on GPU ", uuid, ", which this process does not see (it sees ",
                   seen.empty() ? "none" : absl::StrJoin(seen, ", "),
                   "; CUDA_VISIBLE_DEVICES decides which GPUs a process sees)"));
#else
  return fallback;
#endif
}

}  // namespace commd
