#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_join.h"
#include "kernels/cuda/dl_library.h"

namespace commd::kernels {
namespace {

const CublasApi* g_testing = nullptr;

}  // namespace

absl::StatusOr<CublasApi> LoadCublas(const std::string& library) {
  absl::StatusOr<void*> handle = DlOpen(library);
  if (!handle.ok()) return handle.status();
  CublasApi api;
  api.library = library;
  absl::Status missing;
#define COMMD_CUBLAS_RESOLVE_(member, symbol, type) \
  DlResolve(*handle, #symbol, library, "cuBLAS", &api.member, &missing);
  COMMD_CUBLAS_FUNCTIONS(COMMD_CUBLAS_RESOLVE_)
#undef COMMD_CUBLAS_RESOLVE_
  if (!missing.ok()) {
    ::dlclose(*handle);
    return missing;
  }
  return api;  // stays loaded: cuBLAS handles keep its kernels in the context
}

absl::StatusOr<const CublasApi*> Cublas() {
  if (g_testing != nullptr) return g_testing;
  static const absl::StatusOr<CublasApi> api = []() -> absl::StatusOr<CublasApi> {
    const char* env = std::getenv(kCublasLibraryEnv);
    if (env != nullptr && *env != '\0') {
      absl::StatusOr<CublasApi> loaded = LoadCublas(env);
      if (loaded.ok()) return loaded;
      return absl::FailedPreconditionError(
          absl::StrCat("the fused matmuls on CUDA buffers need cuBLAS: ", kCublasLibraryEnv, "=",
                       env, ": ", loaded.status().message()));
    }
    std::vector<std::string> why;
    for (const char* library : kCublasLibraries) {
      absl::StatusOr<CublasApi> loaded = LoadCublas(library);
      if (loaded.ok()) return loaded;
      why.emplace_back(loaded.status().message());
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the fused matmuls on CUDA buffers need cuBLAS (", absl::StrJoin(kCublasLibraries, " or "),
        ", from the CUDA toolkit or the nvidia-cublas wheel; ", kCublasLibraryEnv,
        " names another): ", absl::StrJoin(why, "; ")));
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

std::string CublasStatusText(const CublasApi& api, cublasStatus_t status) {
  const char* name = api.get_status_name != nullptr ? api.get_status_name(status) : nullptr;
  const char* text = api.get_status_string != nullptr ? api.get_status_string(status) : nullptr;
  return absl::StrCat(name != nullptr ? name : "unknown status", ": ",
                      text != nullptr ? text : "no description", " (cublasStatus_t ",
                      static_cast<int>(status), ")");
}

namespace cuda_internal {
void SetCublasForTesting(const CublasApi* api) { g_testing = api; }
}  // namespace cuda_internal

}  // namespace commd::kernels
