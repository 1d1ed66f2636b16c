// The one table of cuBLAS entry points commd calls (the fused matmuls' GEMMs,
// kernels/cuda/fused_matmul.h), loaded with dlopen the way common/cuda_driver_api.h loads the
// driver: the SDK links no cuBLAS, so it still loads (and its host groups run) on machines
// without a GPU or without cuBLAS, and only a CUDA group's first fused matmul needs it.
//
//   ASSIGN_OR_RETURN(const CublasApi* blas, Cublas(cu->driver_version));  // context current
//   CUBLAS_RETURN_IF_ERROR(*blas, blas->set_stream(handle, stream));
//
// The library is $COMMD_CUBLAS_LIBRARY when set (a path or a soname), else chosen among
// kCublasLibraries (ChooseCublas): one the process already loaded (PyTorch's, say) before
// any other, else the newest the driver serves, and only one that completes a
// cublasCreate/cublasDestroy round trip. The entry points used have had these signatures
// since CUDA 11.4 (cublasGetStatusName, cublasGetStatusString, cublasSetWorkspace;
// cublasGemmEx with a cublasComputeType_t since 11.0), so cuBLAS 12 and 13 both serve. Only
// in builds with CUDA headers.
#ifndef COMMD_KERNELS_CUDA_CUBLAS_API_H_
#define COMMD_KERNELS_CUDA_CUBLAS_API_H_

#include <cublas_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace commd::kernels {

// A cuBLAS to try: its soname (or a path) and the lowest driver it runs on (cuDriverGetVersion's
// number: a cuBLAS of CUDA major M needs a driver of M.0, as the runtime does). In order of
// preference.
struct CublasCandidate {
  const char* library;
  int driver_needed;
};
inline constexpr CublasCandidate kCublasLibraries[] = {{"libcublas.so.13", 13000},
                                                       {"libcublas.so.12", 12000}};
inline constexpr char kCublasLibraryEnv[] = "COMMD_CUBLAS_LIBRARY";

using CublasCreateFn = cublasStatus_t (*)(cublasHandle_t*);
using CublasDestroyFn = cublasStatus_t (*)(cublasHandle_t);
using CublasSetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using CublasSetWorkspaceFn = cublasStatus_t (*)(cublasHandle_t, void*, size_t);
using CublasGetStatusStringFn = const char* (*)(cublasStatus_t);
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                          int m, int n, int k, const void* alpha, const void* a,
                                          cudaDataType a_type, int lda, const void* b,
                                          cudaDataType b_type, int ldb, const void* beta, void* c,
                                          cudaDataType c_type, int ldc, cublasComputeType_t,
                                          cublasGemmAlgo_t);

// X(member, exported symbol, pointer type).
#define COMMD_CUBLAS_FUNCTIONS(X)                                      \
  X(create, cublasCreate_v2, CublasCreateFn)                           \
  X(destroy, cublasDestroy_v2, CublasDestroyFn)                        \
  X(set_stream, cublasSetStream_v2, CublasSetStreamFn)                 \
  X(set_workspace, cublasSetWorkspace_v2, CublasSetWorkspaceFn)        \
  X(get_status_name, cublasGetStatusName, CublasGetStatusStringFn)     \
  X(get_status_string, cublasGetStatusString, CublasGetStatusStringFn) \
  X(gemm_ex, cublasGemmEx, CublasGemmExFn)

struct CublasApi {
#define COMMD_CUBLAS_MEMBER_(member, symbol, type) type member = nullptr;
  COMMD_CUBLAS_FUNCTIONS(COMMD_CUBLAS_MEMBER_)
#undef COMMD_CUBLAS_MEMBER_
  std::string library;  // what was loaded, as given to dlopen
};

// Loads `library` and resolves every entry point. UNAVAILABLE naming the library (and the
// missing symbol, or dlerror's text) otherwise. A loaded library stays loaded. Thread-safe.
absl::StatusOr<CublasApi> LoadCublas(const std::string& library);

// Whether `api` works here: cublasCreate then cublasDestroy in the current CUDA context. A
// cuBLAS newer than the driver loads fine and fails only here (CUBLAS_STATUS_NOT_INITIALIZED).
// UNAVAILABLE naming the library and cuBLAS's status otherwise.
absl::Status CublasRoundTrip(const CublasApi& api);

// The cuBLAS of this process among `candidates` (in order of preference) for a driver of
// `driver_version`, in the current CUDA context:
//   1. a candidate the process has already loaded (dlopen RTLD_NOLOAD; e.g. PyTorch's
//      libcublas.so.12): a second cuBLAS beside it would double the kernels and handles;
//   2. else each candidate whose driver_needed <= driver_version, in order;
// each accepted only after CublasRoundTrip, the next tried otherwise. FAILED_PRECONDITION
// naming every candidate and why it was not taken when none is. A candidate whose round
// trip failed stays loaded (it may have started its runtime). Blocks for dlopen; thread-safe.
absl::StatusOr<CublasApi> ChooseCublas(absl::Span<const CublasCandidate> candidates,
                                       int driver_version);

// The process's table, chosen once (the first call's context and driver decide):
// $COMMD_CUBLAS_LIBRARY (after its round trip), else ChooseCublas(kCublasLibraries,
// driver_version). `driver_version`: cuDriverGetVersion's answer (the SDK's driver table).
// FAILED_PRECONDITION naming every library tried and why when none serves. Call with the
// group's context current. Thread-safe; the pointer lives as long as the process.
absl::StatusOr<const CublasApi*> Cublas(int driver_version);

// "CUBLAS_STATUS_NOT_SUPPORTED: the requested functionality is not supported
// (cublasStatus_t 15)".
std::string CublasStatusText(const CublasApi& api, cublasStatus_t status);

namespace cuda_internal {
// Tests of the host side replace the table (a fake that records the GEMMs); null restores
// the loaded one. Not thread-safe against calls: set it before any.
void SetCublasForTesting(const CublasApi* api);
}  // namespace cuda_internal

}  // namespace commd::kernels

// Errors of a cuBLAS call keep file:line and the call, as CU_RETURN_IF_ERROR does.
#define CUBLAS_RETURN_IF_ERROR(api, call)                                                     \
  do {                                                                                        \
    const cublasStatus_t commd_cublas_status_ = (call);                                       \
    if (commd_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                      \
      return ::absl::InternalError(::absl::StrCat(                                            \
          #call, ": ", ::commd::kernels::CublasStatusText((api), commd_cublas_status_), " [", \
          __FILE__, ":", __LINE__, "]"));                                                     \
    }                                                                                         \
  } while (0)

#endif  // COMMD_KERNELS_CUDA_CUBLAS_API_H_
