#include "common/cuda_driver.h"

#include "absl/strings/str_cat.h"

#ifdef COMMD_HAVE_CUDA
#include "common/cuda_driver_api.h"
#endif

namespace commd {
namespace {

#ifdef COMMD_HAVE_CUDA
CudaDriverInfo Probe() {
  CudaDriverInfo info;
  info.built_with_cuda = true;
  info.driver_floor = kCudaDriverFloor;
  absl::StatusOr<const CudaDriverApi*> api = CudaDriver();
  if (!api.ok()) {
    // LoadCudaDriver's one FAILED_PRECONDITION: a driver below the floor.
    info.below_floor = api.status().code() == absl::StatusCode::kFailedPrecondition;
    info.summary = std::string(api.status().message());
    return info;
  }
  const CudaDriverApi& cu = **api;
  info.driver_version = cu.driver_version;
  const std::string driver =
      absl::StrCat("CUDA driver ", CudaDriverVersionText(cu.driver_version), " in ", cu.library);
  if (CUresult r = cu.device_get_count(&info.device_count); r != CUDA_SUCCESS) {
    info.device_count = 0;
    info.summary = absl::StrCat(driver, ": cuDeviceGetCount failed with CUresult ", r);
    return info;
  }
  info.available = info.device_count > 0;
  info.summary = info.available ? absl::StrCat(info.device_count, " device(s), ", driver)
                                : absl::StrCat(driver, " but no CUDA device");
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

const CudaDriverInfo& ProbeCudaDriver() {
  static const CudaDriverInfo info = Probe();
  return info;
}

}  // namespace commd
