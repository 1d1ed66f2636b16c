// The one table of CUDA driver entry points commd calls (the daemon's CUDA memory backend, the
// SDK's buffer mapping, the recorder's stream-ordered writes and the SDK's CUDA collectives),
// loaded from libcuda.so.1 with dlopen and cuGetProcAddress, the way NCCL loads its driver
// functions. Nothing links libcuda or needs the CUDA runtime for this, so one binary starts on
// nodes with and without an NVIDIA driver, and the daemon has no CUDA runtime at all (a
// statically linked runtime demands a driver at least as new as itself: CUDA 13's needs R580).
//
//   ASSIGN_OR_RETURN(const CudaDriverApi* cu, CudaDriver());
//   CU_RETURN_IF_ERROR(cu->mem_alloc(&ptr, bytes));   // common/cuda_check.h
//
// Driver floor: CUDA 12.0 (driver R525). Every entry point is asked for through
// cuGetProcAddress_v2, new in 12.0, which tells "no such function" from "function newer than
// the ABI version asked for"; the newest ABI in the table is cuStreamWriteValue64's 11.7. A
// driver below the floor is refused with its version and the floor, not "no driver".
//
// Each entry is requested at the ABI version its PFN type in <cudaTypedefs.h> names (the
// version where that signature appeared), so the pointer's type and the ABI the driver hands
// back are one token in the list below and cannot disagree. Only in builds with CUDA headers
// (COMMD_HAVE_CUDA); common/cuda_driver.h is the part every build has.
#ifndef COMMD_COMMON_CUDA_DRIVER_API_H_
#define COMMD_COMMON_CUDA_DRIVER_API_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

#include "absl/status/statusor.h"

namespace commd {

// The lowest driver API version (cuDriverGetVersion's number) commd loads: 12.0, see above.
inline constexpr int kCudaDriverFloor = 12000;

// The library loaded unless COMMD_CUDA_DRIVER_LIBRARY names another (a path or a soname);
// tests point that at tests/fixtures/fake_libcuda.
inline constexpr char kCudaDriverLibrary[] = "libcuda.so.1";
inline constexpr char kCudaDriverLibraryEnv[] = "COMMD_CUDA_DRIVER_LIBRARY";

// X(member, driver function, ABI version of its PFN type). The function name is the driver's
// base name (cuMemAlloc, not cuMemAlloc_v2: cuGetProcAddress picks the _v2 by the version).
#define COMMD_CUDA_DRIVER_FUNCTIONS(X)                                       \
  /* probe */                                                                \
  X(init, cuInit, 2000)                                                      \
  X(driver_get_version, cuDriverGetVersion, 2020)                            \
  X(device_get_count, cuDeviceGetCount, 2000)                                \
  X(device_get, cuDeviceGet, 2000)                                           \
  X(device_get_attribute, cuDeviceGetAttribute, 2000)                        \
  X(device_get_uuid, cuDeviceGetUuid, 11040)                                 \
  X(get_error_name, cuGetErrorName, 6000)                                    \
  /* contexts */                                                             \
  X(primary_ctx_retain, cuDevicePrimaryCtxRetain, 7000)                      \
  X(primary_ctx_release, cuDevicePrimaryCtxRelease, 11000)                   \
  X(ctx_push_current, cuCtxPushCurrent, 4000)                                \
  X(ctx_pop_current, cuCtxPopCurrent, 4000)                                  \
  X(stream_get_ctx, cuStreamGetCtx, 9020)                                    \
  X(ctx_get_device, cuCtxGetDevice, 2000)                                    \
  X(ctx_synchronize, cuCtxSynchronize, 2000)                                 \
  /* device and pinned host memory */                                        \
  X(mem_alloc, cuMemAlloc, 3020)                                             \
  X(mem_free, cuMemFree, 3020)                                               \
  X(mem_host_alloc, cuMemHostAlloc, 2020)                                    \
  X(mem_free_host, cuMemFreeHost, 2000)                                      \
  X(mem_host_register, cuMemHostRegister, 6050)                              \
  X(mem_host_unregister, cuMemHostUnregister, 4000)                          \
  X(mem_host_get_device_pointer, cuMemHostGetDevicePointer, 3020)            \
  X(memset_d8, cuMemsetD8, 3020)                                             \
  X(memcpy_dtod_async, cuMemcpyDtoDAsync, 3020)                              \
  /* shareable allocations (VMM) */                                          \
  X(mem_get_allocation_granularity, cuMemGetAllocationGranularity, 10020)    \
  X(mem_create, cuMemCreate, 10020)                                          \
  X(mem_release, cuMemRelease, 10020)                                        \
  X(mem_export_to_shareable_handle, cuMemExportToShareableHandle, 10020)     \
  X(mem_import_from_shareable_handle, cuMemImportFromShareableHandle, 10020) \
  X(mem_address_reserve, cuMemAddressReserve, 10020)                         \
  X(mem_address_free, cuMemAddressFree, 10020)                               \
  X(mem_map, cuMemMap, 10020)                                                \
  X(mem_unmap, cuMemUnmap, 10020)                                            \
  X(mem_set_access, cuMemSetAccess, 10020)                                   \
  /* legacy IPC (devices without VMM) */                                     \
  X(ipc_get_mem_handle, cuIpcGetMemHandle, 4010)                             \
  X(ipc_open_mem_handle, cuIpcOpenMemHandle, 11000)                          \
  X(ipc_close_mem_handle, cuIpcCloseMemHandle, 4010)                         \
  /* stream-ordered writes and completion */                                 \
  X(stream_write_value64, cuStreamWriteValue64, 11070)                       \
  X(stream_is_capturing, cuStreamIsCapturing, 10000)                         \
  X(event_create, cuEventCreate, 2000)                                       \
  X(event_record, cuEventRecord, 2000)                                       \
  X(event_query, cuEventQuery, 2000)                                         \
  X(event_synchronize, cuEventSynchronize, 2000)                             \
  X(event_destroy, cuEventDestroy, 4000)

struct CudaDriverApi {
#define COMMD_CUDA_DRIVER_MEMBER_(member, symbol, version) \
  PFN_##symbol##_v##version member = nullptr;
  COMMD_CUDA_DRIVER_FUNCTIONS(COMMD_CUDA_DRIVER_MEMBER_)
#undef COMMD_CUDA_DRIVER_MEMBER_

  std::string library;     // what was loaded, as given to dlopen
  int driver_version = 0;  // cuDriverGetVersion: 12020 for 12.2
};

// Loads `library`, checks its version against kCudaDriverFloor, resolves every entry point
// and calls cuInit(0). Errors name the library and what is wrong: UNAVAILABLE when the
// library cannot be loaded, is not a CUDA driver or lacks an entry point (naming it and its
// ABI version), FAILED_PRECONDITION when the driver is below the floor, and cuInit's error.
// A library that loaded stays loaded for the life of the process (drivers are not unloaded).
// Blocks for the dlopen; thread-safe. Each call loads anew: use CudaDriver() outside tests.
absl::StatusOr<CudaDriverApi> LoadCudaDriver(const std::string& library);

// The process's table: LoadCudaDriver of $COMMD_CUDA_DRIVER_LIBRARY or kCudaDriverLibrary,
// done once (the first caller blocks for it; later callers get the same answer). The
// pointer lives as long as the process. Thread-safe.
absl::StatusOr<const CudaDriverApi*> CudaDriver();

// Whether a CUDA runtime of `runtime_version` (CUDART_VERSION of the SDK's build: 13000 for
// 13.0) runs on the driver of `driver_version` loaded from `library`. A runtime needs a driver
// of its major version or newer (CUDA's minor version compatibility: any 13.x runtime runs on
// a 13.0 driver, R580; any 12.x on 12.0, R525); the runtime itself refuses an older one with
// cudaErrorInsufficientDriver at its first call. FAILED_PRECONDITION naming both versions and
// what to install otherwise. The daemon links no runtime and never needs this; the SDK's
// kernels do (statically linked cudart). Pure: no driver call.
absl::Status CheckDriverServesRuntime(int driver_version, const std::string& library,
                                      int runtime_version);

// "12.2 (R535)": a driver API version as operators know it (the branch where known).
std::string CudaDriverVersionText(int version);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": cuDeviceGetUuid's bytes as nvidia-smi and NVML
// print them, the one name of a GPU that does not depend on CUDA_VISIBLE_DEVICES.
std::string CudaUuidText(const CUuuid& uuid);

}  // namespace commd

#endif  // COMMD_COMMON_CUDA_DRIVER_API_H_
