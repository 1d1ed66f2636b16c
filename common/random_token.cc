#include "common/random_token.h"

#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "common/status_macros.h"

namespace commd {

absl::StatusOr<std::string> RandomToken() {
  char raw[16];
  SYS_ASSIGN_OR_RETURN(ssize_t n, ::getrandom(raw, sizeof(raw), 0));
  if (n != static_cast<ssize_t>(sizeof(raw))) return absl::InternalError("getrandom: short read");
  return absl::BytesToHexString(absl::string_view(raw, sizeof(raw)));
}

}  // namespace commd
