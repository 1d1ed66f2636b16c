#include "common/cuda_driver.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifdef COMMD_HAVE_CUDA
#include "common/cuda_check.h"
#endif

namespace commd {
namespace {

#ifdef COMMD_HAVE_CUDA
// Driver API version the entry points are requested at (CUDA 12.0 ABI).
constexpr unsigned int kDriverApiVersion = 12000;

template <typename Fn>
bool GetEntryPoint(const char* name, Fn* fn, std::string* why) {
  return GetDriverEntryPoint(name, reinterpret_cast<void**>(fn), why);
}

CudaDriverInfo Probe() {
  CudaDriverInfo info;
  info.built_with_cuda = true;
  decltype(&cuInit) init = nullptr;
  decltype(&cuDriverGetVersion) get_version = nullptr;
  decltype(&cuDeviceGetCount) get_count = nullptr;
  if (!GetEntryPoint("cuInit", &init, &info.summary) ||
      !GetEntryPoint("cuDriverGetVersion", &get_version, &info.summary) ||
      !GetEntryPoint("cuDeviceGetCount", &get_count, &info.summary)) {
    return info;
  }
  if (CUresult r = init(0); r != CUDA_SUCCESS) {
    info.summary = absl::StrCat("CUDA driver present but cuInit failed (CUresult ", r, ")");
    return info;
  }
  get_version(&info.driver_version);
  get_count(&info.device_count);
  info.available = info.device_count > 0;
  info.summary = absl::StrCat(info.device_count, " device(s), driver ", info.driver_version / 1000,
                              ".", (info.driver_version % 1000) / 10);
  return info;
}
#else
CudaDriverInfo Probe() {
  CudaDriverInfo info;
  info.summary = "built without CUDA (COMMD_CUDA=OFF or no nvcc at build time)";
  return info;
}
#endif

}  // namespace

#ifdef COMMD_HAVE_CUDA
bool GetDriverEntryPoint(const char* name, void** fn, std::string* why) {
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, fn, kDriverApiVersion, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || *fn == nullptr) {
    *why = absl::StrCat("no CUDA driver: ", name, " unavailable (",
                        err != cudaSuccess ? cudaGetErrorName(err) : "symbol not found", ": ",
                        err != cudaSuccess ? cudaGetErrorString(err) : "driver too old", ")");
    return false;
  }
  return true;
}

absl::Status ResolveDriverFunctions(std::initializer_list<DriverFunction> table) {
  std::string why;
  for (const DriverFunction& f : table) {
    if (!GetDriverEntryPoint(f.name, f.fn, &why)) return absl::UnavailableError(why);
  }
  return absl::OkStatus();
}

absl::StatusOr<const CuStreamMemApi*> StreamMemApi() {
  static const absl::StatusOr<CuStreamMemApi> api = []() -> absl::StatusOr<CuStreamMemApi> {
    CuStreamMemApi a;
    RETURN_IF_ERROR(ResolveDriverFunctions({
        {"cuMemHostRegister", reinterpret_cast<void**>(&a.mem_host_register)},
        {"cuMemHostUnregister", reinterpret_cast<void**>(&a.mem_host_unregister)},
        {"cuMemHostGetDevicePointer", reinterpret_cast<void**>(&a.mem_host_get_device_pointer)},
        {"cuStreamWriteValue64", reinterpret_cast<void**>(&a.stream_write_value64)},
        {"cuStreamGetCtx", reinterpret_cast<void**>(&a.stream_get_ctx)},
        {"cuCtxPushCurrent", reinterpret_cast<void**>(&a.ctx_push_current)},
        {"cuCtxPopCurrent", reinterpret_cast<void**>(&a.ctx_pop_current)},
    }));
    return a;
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

absl::StatusOr<const CuCollectiveApi*> CollectiveApi() {
  static const absl::StatusOr<CuCollectiveApi> api = []() -> absl::StatusOr<CuCollectiveApi> {
    CuCollectiveApi a;
    auto at = [](auto* fn) { return reinterpret_cast<void**>(fn); };
    RETURN_IF_ERROR(ResolveDriverFunctions({
        {"cuDeviceGet", at(&a.device_get)},
        {"cuDevicePrimaryCtxRetain", at(&a.primary_ctx_retain)},
        {"cuDevicePrimaryCtxRelease", at(&a.primary_ctx_release)},
        {"cuMemHostAlloc", at(&a.mem_host_alloc)},
        {"cuMemFreeHost", at(&a.mem_free_host)},
        {"cuMemHostGetDevicePointer", at(&a.mem_host_get_device_pointer)},
        {"cuMemAlloc", at(&a.mem_alloc)},
        {"cuMemFree", at(&a.mem_free)},
        {"cuEventCreate", at(&a.event_create)},
        {"cuEventRecord", at(&a.event_record)},
        {"cuEventQuery", at(&a.event_query)},
        {"cuEventSynchronize", at(&a.event_synchronize)},
        {"cuEventDestroy", at(&a.event_destroy)},
        {"cuCtxPushCurrent", at(&a.ctx_push_current)},
        {"cuCtxPopCurrent", at(&a.ctx_pop_current)},
    }));
    return a;
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

std::string CuErrorText(CUresult result) {
  static const auto get_name = [] {
    decltype(&cuGetErrorName) fn = nullptr;
    std::string ignored;
    GetEntryPoint("cuGetErrorName", &fn, &ignored);
    return fn;
  }();
  const char* name = nullptr;
  if (get_name != nullptr && get_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return absl::StrCat("CUresult ", static_cast<int>(result));
}
#endif

const CudaDriverInfo& ProbeCudaDriver() {
  static const CudaDriverInfo info = Probe();
  return info;
}

}  // namespace commd
