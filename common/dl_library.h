// DlLibrary: a shared library opened with dlopen and the table of entry points commd takes
// from it, the one way commd loads what it does not link: the CUDA driver
// (common/cuda_driver_api.h), NVML (daemon/topology/nvml_api.h), cuBLAS and NCCL
// (kernels/cuda/cublas_api.h, nccl_api.h). Linking none of them is what lets one binary start
// on nodes with and without each.
//
//   ASSIGN_OR_RETURN(DlLibrary lib, DlLibrary::Open("libnccl.so.2"));
//   RETURN_IF_ERROR(lib.Resolve({{"ncclGetVersion", DlAddress(&api.get_version)}}, "NCCL"));
//   lib.KeepLoaded();  // its state lives on in the process
//
// The wording is the same for every library: "cannot load <library> (<dlerror>)" and
// "<library> is not <what>: it exports no <symbol>". A DlLibrary closes its library when
// destroyed, unless KeepLoaded was called. Open and Resolve block for the dynamic loader;
// thread-safe as dlopen is.
#ifndef COMMD_COMMON_DL_LIBRARY_H_
#define COMMD_COMMON_DL_LIBRARY_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace commd {

// One entry point to resolve: the exported name and where its address goes.
struct DlSymbol {
  const char* name;
  void** address;
};

// The address of a function pointer as Resolve fills it (POSIX dlsym hands back functions as
// void*, and a function pointer has the size and representation of one).
template <typename Fn>
void** DlAddress(Fn* fn) {
  static_assert(sizeof(Fn) == sizeof(void*));
  return reinterpret_cast<void**>(fn);
}

class DlLibrary {
 public:
  // `name` (a path, or a soname searched the dlopen way) opened with RTLD_NOW | RTLD_LOCAL,
  // so that its symbols satisfy no one else's lookups. UNAVAILABLE "cannot load <name>
  // (<dlerror's text>)" otherwise.
  static absl::StatusOr<DlLibrary> Open(const std::string& name);

  // Whether the process has `name` loaded already (dlopen RTLD_NOLOAD); loads nothing and
  // leaves the process's own reference as it is.
  static bool IsLoaded(const std::string& name);

  DlLibrary(DlLibrary&& other) noexcept;
  DlLibrary& operator=(DlLibrary&& other) noexcept;
  DlLibrary(const DlLibrary&) = delete;
  DlLibrary& operator=(const DlLibrary&) = delete;
  ~DlLibrary();

  // Fills every entry of `table` (null where the symbol is missing). UNAVAILABLE "<name> is not
  // <what>: it exports no <symbol>" naming the first missing one, if any. `what` is a noun
  // phrase: "a usable cuBLAS", "an NVML library".
  absl::Status Resolve(absl::Span<const DlSymbol> table, absl::string_view what) const;

  // Leaves the library loaded for the life of the process: drivers start threads, and
  // cuBLAS and NCCL keep kernels and communicators in it.
  void KeepLoaded() { keep_ = true; }

  const std::string& name() const { return name_; }

 private:
  DlLibrary(void* handle, std::string name) : handle_(handle), name_(std::move(name)) {}

  void* handle_;  // null once moved from
  bool keep_ = false;
  std::string name_;
};

// A library to choose among several: its name, and why it cannot serve here before it is even
// opened (OK when it can; a cuBLAS newer than the driver, say).
struct DlCandidate {
  std::string name;
  absl::Status usable;
};

// The first of `candidates` that `load` (which opens it and checks what it must) accepts:
// first those the process has already loaded, in order, when `prefer_loaded` (a second copy of
// a library beside the process's own doubles its state), then the others, in order, each only
// when `usable` (an already loaded one is taken as it is). nullopt when none serves, with why
// each was not taken appended to `why`. Blocks for `load`.
template <typename T>
std::optional<T> DlLoadFirst(absl::Span<const DlCandidate> candidates, bool prefer_loaded,
                             absl::FunctionRef<absl::StatusOr<T>(const std::string&)> load,
                             std::vector<std::string>* why) {
  std::vector<bool> tried(candidates.size(), false);
  const auto attempt = [&](size_t i) -> std::optional<T> {
    tried[i] = true;
    absl::StatusOr<T> loaded = load(candidates[i].name);
    if (loaded.ok()) return *std::move(loaded);
    why->emplace_back(loaded.status().message());
    return std::nullopt;
  };
  if (prefer_loaded) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!DlLibrary::IsLoaded(candidates[i].name)) continue;
      if (std::optional<T> found = attempt(i)) return found;
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (tried[i]) continue;
    if (!candidates[i].usable.ok()) {
      why->emplace_back(candidates[i].usable.message());
      continue;
    }
    if (std::optional<T> found = attempt(i)) return found;
  }
  return std::nullopt;
}

}  // namespace commd

#endif  // COMMD_COMMON_DL_LIBRARY_H_
