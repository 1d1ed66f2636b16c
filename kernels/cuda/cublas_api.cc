#include "kernels/cuda/cublas_api.h"

#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/dl_library.h"
#include "common/status_macros.h"

namespace commd::kernels {
namespace {

const CublasApi* g_testing = nullptr;

}  // namespace

absl::StatusOr<CublasApi> LoadCublas(const std::string& library) {
  ASSIGN_OR_RETURN(DlLibrary lib, DlLibrary::Open(library));
  CublasApi api;
  api.library = library;
  const DlSymbol table[] = {
#define COMMD_CUBLAS_SYMBOL_(member, symbol, type) {#symbol, DlAddress(&api.member)},
      COMMD_CUBLAS_FUNCTIONS(COMMD_CUBLAS_SYMBOL_)
#undef COMMD_CUBLAS_SYMBOL_
  };
  RETURN_IF_ERROR(lib.Resolve(table, "a usable cuBLAS"));
  lib.KeepLoaded();  // cuBLAS handles keep its kernels in the context
  return api;
}

absl::Status CublasRoundTrip(const CublasApi& api) {
  cublasHandle_t handle = nullptr;
  if (const cublasStatus_t st = api.create(&handle); st != CUBLAS_STATUS_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat(api.library, ": cublasCreate failed: ", CublasStatusText(api, st)));
  }
  if (const cublasStatus_t st = api.destroy(handle); st != CUBLAS_STATUS_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat(api.library, ": cublasDestroy failed: ", CublasStatusText(api, st)));
  }
  return absl::OkStatus();
}

namespace {

// `library` loaded and round-tripped, or why not.
absl::StatusOr<CublasApi> LoadWorking(const std::string& library) {
  ASSIGN_OR_RETURN(CublasApi api, LoadCublas(library));
  RETURN_IF_ERROR(CublasRoundTrip(api));
  return api;
}

}  // namespace

absl::StatusOr<CublasApi> ChooseCublas(absl::Span<const CublasCandidate> candidates,
                                       int driver_version) {
  std::vector<DlCandidate> choices;
  std::vector<std::string> names;
  for (const CublasCandidate& c : candidates) {
    names.emplace_back(c.library);
    absl::Status usable;
    if (driver_version < c.driver_needed) {
      usable = absl::FailedPreconditionError(
          absl::StrCat(c.library, " needs CUDA driver ", c.driver_needed / 1000, ".",
                       c.driver_needed % 1000 / 10, " or newer; the driver is ",
                       driver_version / 1000, ".", driver_version % 1000 / 10));
    }
    choices.push_back({c.library, std::move(usable)});
  }
  std::vector<std::string> why;
  if (std::optional<CublasApi> api =
          DlLoadFirst<CublasApi>(choices, /*prefer_loaded=*/true, LoadWorking, &why)) {
    return *std::move(api);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the fused matmuls on CUDA buffers need cuBLAS (", absl::StrJoin(names, " or "),
                   ", from the CUDA toolkit or the nvidia-cublas wheel; ", kCublasLibraryEnv,
                   " names another): ", absl::StrJoin(why, "; ")));
}

absl::StatusOr<const CublasApi*> Cublas(int driver_version) {
  if (g_testing != nullptr) return g_testing;
  static const absl::StatusOr<CublasApi> api = [&]() -> absl::StatusOr<CublasApi> {
    const char* env = std::getenv(kCublasLibraryEnv);
    if (env == nullptr || *env == '\0') return ChooseCublas(kCublasLibraries, driver_version);
    absl::StatusOr<CublasApi> loaded = LoadWorking(env);
    if (loaded.ok()) return loaded;
    return absl::FailedPreconditionError(
        absl::StrCat("the fused matmuls on CUDA buffers need cuBLAS: ", kCublasLibraryEnv, "=", env,
                     ": ", loaded.status().message()));
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
