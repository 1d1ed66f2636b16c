// Loading a library's table of entry points with dlopen, as the SDK loads cuBLAS
// (cublas_api.h) and NCCL (nccl_api.h): the SDK links neither, so it loads without them.
//
//   ASSIGN_OR_RETURN(void* handle, DlOpen(library));
//   absl::Status missing;
//   DlResolve(handle, "ncclGetVersion", library, "NCCL", &api.get_version, &missing);
#ifndef COMMD_KERNELS_CUDA_DL_LIBRARY_H_
#define COMMD_KERNELS_CUDA_DL_LIBRARY_H_

#include <dlfcn.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace commd::kernels {

// `library` (a path or a soname) opened with RTLD_NOW | RTLD_LOCAL, or UNAVAILABLE naming it
// and dlerror's text.
inline absl::StatusOr<void*> DlOpen(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  const char* why = ::dlerror();
  return absl::UnavailableError(
      absl::StrCat("cannot load ", library, " (", why != nullptr ? why : "dlopen failed", ")"));
}

// `*fn` = `symbol` of `handle`; when it is missing, the first such sets `*missing` to
// UNAVAILABLE "<library> is not a usable <what>: it exports no <symbol>".
template <typename Fn>
void DlResolve(void* handle, const char* symbol, const std::string& library, const char* what,
               Fn* fn, absl::Status* missing) {
  *fn = reinterpret_cast<Fn>(::dlsym(handle, symbol));
  if (*fn == nullptr && missing->ok()) {
    *missing = absl::UnavailableError(
        absl::StrCat(library, " is not a usable ", what, ": it exports no ", symbol));
  }
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_CUDA_DL_LIBRARY_H_
