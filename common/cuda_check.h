// Error checks for CUDA driver calls (through common/cuda_driver_api.h's table) that keep
// file:line and the call's text, as common/status_macros.h does for system calls. Only for
// code built with CUDA. commd calls the CUDA runtime only to launch kernels (kernels/cuda).
//
//   CU_RETURN_IF_ERROR(cu->mem_create(&h, size, &prop, 0));
#ifndef COMMD_COMMON_CUDA_CHECK_H_
#define COMMD_COMMON_CUDA_CHECK_H_

#include <cuda.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace commd {

// "CUDA_ERROR_OUT_OF_MEMORY: out of memory", through the driver's own tables when a driver
// is loaded, else the bare number.
std::string CuErrorText(CUresult result);

// Out-of-memory is RESOURCE_EXHAUSTED (the caller asked for more than there is); anything
// else INTERNAL.
inline absl::Status CudaError(bool out_of_memory, const std::string& what, const char* file,
                              int line) {
  const std::string msg = absl::StrCat(what, " [", file, ":", line, "]");
  return out_of_memory ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

}  // namespace commd

#define CU_RETURN_IF_ERROR(call)                                                                  \
  do {                                                                                            \
    const CUresult commd_cu_err_ = (call);                                                        \
    if (commd_cu_err_ != CUDA_SUCCESS) {                                                          \
      return ::commd::CudaError(commd_cu_err_ == CUDA_ERROR_OUT_OF_MEMORY,                        \
                                ::absl::StrCat(#call, ": ", ::commd::CuErrorText(commd_cu_err_)), \
                                __FILE__, __LINE__);                                              \
    }                                                                                             \
  } while (0)

#endif  // COMMD_COMMON_CUDA_CHECK_H_
