// Whether this node can use CUDA, found without linking libcuda: the CUDA runtime is linked
// statically and the driver API is reached through cudaGetDriverEntryPointByVersion, so one
// binary starts on nodes with and without an NVIDIA driver.
//
//   CudaDriverInfo info = ProbeCudaDriver();
//   if (!info.available) LOG << info.summary;   // e.g. "no CUDA driver: ..."
//
// Thread-safe; the probe runs once per process and is cached.
#ifndef COMMD_COMMON_CUDA_DRIVER_H_
#define COMMD_COMMON_CUDA_DRIVER_H_

#include <initializer_list>
#include <string>

#include "absl/status/status.h"

#ifdef COMMD_HAVE_CUDA
#include <cuda.h>

#include "absl/status/statusor.h"
#endif

namespace commd {

struct CudaDriverInfo {
  bool built_with_cuda = false;
  bool available = false;  // a driver answered and at least one device exists
  int device_count = 0;
  int driver_version = 0;  // e.g. 13000 for 13.0
  // One line for logs and status: "2 device(s), driver 13.0" or why CUDA is unavailable.
  std::string summary;
};

const CudaDriverInfo& ProbeCudaDriver();

// Resolves a driver API function at the CUDA 12.0 ABI through the runtime's entry-point
// lookup; false (with why in `error`) when there is no driver or no such function. Only in
// builds with CUDA.
bool GetDriverEntryPoint(const char* name, void** fn, std::string* error);

// Resolves every {name, &function pointer} of `table`; UNAVAILABLE naming the first that is
// missing. Only in builds with CUDA.
struct DriverFunction {
  const char* name;
  void** fn;
};
absl::Status ResolveDriverFunctions(std::initializer_list<DriverFunction> table);

#ifdef COMMD_HAVE_CUDA

// Driver functions for stream-ordered writes into registered host memory (the recorder's
// progress words), resolved once at the CUDA 12.0 ABI. The names are the driver's own
// (cuStreamWriteValue64 resolves to its _v2 ABI at 12.0, as cuda.h's macros expect).
struct CuStreamMemApi {
  decltype(&cuMemHostRegister) mem_host_register = nullptr;
  decltype(&cuMemHostUnregister) mem_host_unregister = nullptr;
  decltype(&cuMemHostGetDevicePointer) mem_host_get_device_pointer = nullptr;
  decltype(&cuStreamWriteValue64) stream_write_value64 = nullptr;
  decltype(&cuStreamGetCtx) stream_get_ctx = nullptr;
  decltype(&cuCtxPushCurrent) ctx_push_current = nullptr;
  decltype(&cuCtxPopCurrent) ctx_pop_current = nullptr;
};

// The table, or UNAVAILABLE naming the first function the driver lacks (or that there is no
// driver). Thread-safe; resolved once per process.
absl::StatusOr<const CuStreamMemApi*> StreamMemApi();

// Driver functions for the SDK's CUDA collectives (client/src/cuda_collectives.cc): the
// group device's primary context, device-mapped pinned host words, device scratch and events
// that tell when enqueued work has finished. Resolved once, at the CUDA 12.0 ABI.
struct CuCollectiveApi {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&cuMemHostAlloc) mem_host_alloc = nullptr;
  decltype(&cuMemFreeHost) mem_free_host = nullptr;
  decltype(&cuMemHostGetDevicePointer) mem_host_get_device_pointer = nullptr;
  decltype(&cuMemAlloc) mem_alloc = nullptr;
  decltype(&cuMemFree) mem_free = nullptr;
  decltype(&cuEventCreate) event_create = nullptr;
  decltype(&cuEventRecord) event_record = nullptr;
  decltype(&cuEventQuery) event_query = nullptr;
  decltype(&cuEventSynchronize) event_synchronize = nullptr;
  decltype(&cuEventDestroy) event_destroy = nullptr;
  decltype(&cuCtxPushCurrent) ctx_push_current = nullptr;
  decltype(&cuCtxPopCurrent) ctx_pop_current = nullptr;
};

// The table, or UNAVAILABLE naming the first function the driver lacks (or that there is no
// driver). Thread-safe; resolved once per process.
absl::StatusOr<const CuCollectiveApi*> CollectiveApi();
#endif  // COMMD_HAVE_CUDA

}  // namespace commd

#endif  // COMMD_COMMON_CUDA_DRIVER_H_
