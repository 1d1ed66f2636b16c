#include "daemon/memory/cuda/memory_backend.h"

#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_check.h"
#include "common/cuda_driver.h"
#include "common/status_macros.h"

namespace commd::memory {
namespace {

// The driver functions the backend calls, resolved once through the runtime's entry-point
// lookup (no link against libcuda, so the daemon starts on nodes without a driver).
struct Driver {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemCreate) mem_create = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemRelease) mem_release = nullptr;

  absl::Status Resolve() {
    return ResolveDriverFunctions({
        {"cuDeviceGet", reinterpret_cast<void**>(&device_get)},
        {"cuDeviceGetAttribute", reinterpret_cast<void**>(&device_get_attribute)},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void**>(&granularity)},
        {"cuMemCreate", reinterpret_cast<void**>(&mem_create)},
        {"cuMemExportToShareableHandle", reinterpret_cast<void**>(&export_handle)},
        {"cuMemRelease", reinterpret_cast<void**>(&mem_release)},
    });
  }
};

class CudaMemoryBackend final : public MemoryBackend {
 public:
  explicit CudaMemoryBackend(Driver driver, int devices) : driver_(driver), devices_(devices) {}

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
    CU_RETURN_IF_ERROR(driver_.device_get(&dev, device.index));
    int vmm = 0;
    CU_RETURN_IF_ERROR(driver_.device_get_attribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    if (!vmm) return LegacyAllocate(device, bytes);
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
      driver_.mem_release(static_cast<CUmemGenericAllocationHandle>(block.handle));
    } else if (block.device_pointer != 0) {
      cudaSetDevice(block.device.index);
      cudaFree(reinterpret_cast<void*>(block.device_pointer));
    }
  }

 private:
  absl::StatusOr<MemoryBlock> CuMemAllocate(const Device& device, CUdevice dev, size_t bytes) {
    int fabric = 0;
    CU_RETURN_IF_ERROR(driver_.device_get_attribute(
        &fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device.index;
    prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | (fabric ? CU_MEM_HANDLE_TYPE_FABRIC : 0));
    size_t granularity = 0;
    CU_RETURN_IF_ERROR(
        driver_.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t rounded = (bytes + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle;
    CU_RETURN_IF_ERROR(driver_.mem_create(&handle, rounded, &prop, 0));
    MemoryBlock block;
    block.device = device;
    block.bytes = rounded;
    block.handle = handle;
    int fd = -1;
    if (CUresult r =
            driver_.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        r != CUDA_SUCCESS) {
      driver_.mem_release(handle);
      return absl::InternalError(
          absl::StrCat("cuMemExportToShareableHandle(POSIX fd): ", CuErrorText(r)));
    }
    block.fd.reset(fd);
    if (fabric) {
      CUmemFabricHandle fh;
      if (driver_.export_handle(&fh, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0) == CUDA_SUCCESS) {
        block.opaque_handle.assign(reinterpret_cast<const char*>(&fh), sizeof(fh));
      }
    }
    return block;
  }

  // Devices without VMM: a cudaMalloc'd buffer shared through a legacy IPC handle (64 bytes
  // that travel in the gRPC answer; no fd).
  absl::StatusOr<MemoryBlock> LegacyAllocate(const Device& device, size_t bytes) {
    absl::MutexLock lock(&runtime_mu_);  // cudaSetDevice is per thread; keep pairs together
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
    void* ptr = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
    cudaIpcMemHandle_t ipc;
    if (cudaError_t e = cudaIpcGetMemHandle(&ipc, ptr); e != cudaSuccess) {
      cudaFree(ptr);
      return absl::InternalError(absl::StrCat("cudaIpcGetMemHandle: ", cudaGetErrorString(e)));
    }
    MemoryBlock block;
    block.device = device;
    block.bytes = bytes;
    block.device_pointer = reinterpret_cast<uint64_t>(ptr);
    block.opaque_handle.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
    return block;
  }

  const Driver driver_;
  const int devices_;
  absl::Mutex runtime_mu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend() {
  const CudaDriverInfo& info = ProbeCudaDriver();
  if (!info.available) return absl::UnavailableError(info.summary);
  Driver driver;
  RETURN_IF_ERROR(driver.Resolve());
  return std::make_unique<CudaMemoryBackend>(driver, info.device_count);
}

}  // namespace commd::memory
