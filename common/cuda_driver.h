// Whether this node can use CUDA, found without linking libcuda or the CUDA runtime: the
// driver is loaded with dlopen (common/cuda_driver_api.h), so one binary starts on nodes with
// and without an NVIDIA driver. Every build has this probe; builds without CUDA say so.
//
//   CudaDriverInfo info = ProbeCudaDriver();
//   if (!info.available) LOG << info.summary;   // e.g. "no CUDA driver: cannot load ..."
//
// Thread-safe; the probe runs once per process and is cached.
#ifndef COMMD_COMMON_CUDA_DRIVER_H_
#define COMMD_COMMON_CUDA_DRIVER_H_

#include <string>

namespace commd {

struct CudaDriverInfo {
  bool built_with_cuda = false;
  bool available = false;  // a driver at or above the floor answered and a device exists
  int device_count = 0;
  int driver_version = 0;    // e.g. 13000 for 13.0; 0 when no driver answered
  int driver_floor = 0;      // the lowest driver commd loads (12000); 0 in builds without CUDA
  bool below_floor = false;  // a driver answered with a version below driver_floor
  // One line for logs and status: "2 device(s), CUDA driver 13.0 (R580)" or why CUDA is
  // unavailable: no driver, a driver below commd's floor (with both versions), a driver that
  // lacks an entry point (naming it), or no device.
  std::string summary;
};

const CudaDriverInfo& ProbeCudaDriver();

}  // namespace commd

#endif  // COMMD_COMMON_CUDA_DRIVER_H_
