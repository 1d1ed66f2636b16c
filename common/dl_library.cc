#include "common/dl_library.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace commd {

absl::StatusOr<DlLibrary> DlLibrary::Open(const std::string& name) {
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::UnavailableError(
        absl::StrCat("cannot load ", name, " (", why != nullptr ? why : "dlopen failed", ")"));
  }
  return DlLibrary(handle, name);
}

bool DlLibrary::IsLoaded(const std::string& name) {
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  ::dlclose(handle);  // drops the reference NOLOAD took; the process's own stays
  return true;
}

DlLibrary::DlLibrary(DlLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      keep_(other.keep_),
      name_(std::move(other.name_)) {}

DlLibrary& DlLibrary::operator=(DlLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr && !keep_) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    keep_ = other.keep_;
    name_ = std::move(other.name_);
  }
  return *this;
}

DlLibrary::~DlLibrary() {
  if (handle_ != nullptr && !keep_) ::dlclose(handle_);
}

absl::Status DlLibrary::Resolve(absl::Span<const DlSymbol> table, absl::string_view what) const {
  const char* missing = nullptr;
  for (const DlSymbol& symbol : table) {
    *symbol.address = ::dlsym(handle_, symbol.name);
    if (*symbol.address == nullptr && missing == nullptr) missing = symbol.name;
  }
  if (missing == nullptr) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(name_, " is not ", what, ": it exports no ", missing));
}

}  // namespace commd
