#include "common/runtime_dir.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace commd {

std::string DefaultRuntimeDir() {
  if (::geteuid() == 0) return "/run/commd";
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/commd");
  }
  return absl::StrCat("/tmp/commd-", ::geteuid());
}

std::string ClientRuntimeDir(const std::string& explicit_dir) {
  if (!explicit_dir.empty()) return explicit_dir;
  if (const char* env = std::getenv("COMMD_RUNTIME_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return DefaultRuntimeDir();
}

}  // namespace commd
