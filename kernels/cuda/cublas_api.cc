#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <utility>
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

// `library` loaded and round-tripped, or why not (appended to `why`).
std::optional<CublasApi> Try(const std::string& library, std::vector<std::string>* why) {
  absl::StatusOr<CublasApi> loaded = LoadCublas(library);
  absl::Status st = loaded.status();
  if (st.ok()) st = CublasRoundTrip(*loaded);
  if (st.ok()) return *std::move(loaded);
  why->emplace_back(st.message());
  return std::nullopt;
}

bool AlreadyLoaded(const char* library) {
  void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  ::dlclose(handle);  // drops the reference NOLOAD took; the process's own stays
  return true;
}

}  // namespace

absl::StatusOr<CublasApi> ChooseCublas(absl::Span<const CublasCandidate> candidates,
                                       int driver_version) {
  std::vector<std::string> why;
  std::vector<bool> tried(candidates.size(), false);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!AlreadyLoaded(candidates[i].library)) continue;
    tried[i] = true;
    if (auto api = Try(candidates[i].library, &why)) return *std::move(api);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (tried[i]) continue;
    const CublasCandidate& c = candidates[i];
    if (driver_version < c.driver_needed) {
      why.push_back(absl::StrCat(c.library, " needs CUDA driver ", c.driver_needed / 1000, ".",
                                 c.driver_needed % 1000 / 10, " or newer; the driver is ",
                                 driver_version / 1000, ".", driver_version % 1000 / 10));
      continue;
    }
    if (auto api = Try(c.library, &why)) return *std::move(api);
  }
  std::vector<std::string> names;
  for (const CublasCandidate& c : candidates) names.emplace_back(c.library);
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
    std::vector<std::string> why;
    if (auto loaded = Try(env, &why)) return *std::move(loaded);
    return absl::FailedPreconditionError(
        absl::StrCat("the fused matmuls on CUDA buffers need cuBLAS: ", kCublasLibraryEnv, "=", env,
                     ": ", why.front()));
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
