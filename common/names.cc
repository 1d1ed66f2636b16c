#include "common/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace commd {
namespace {

bool Allowed(char c, bool slash) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == ':' || (slash && c == '/');
}

absl::Status Validate(absl::string_view kind, absl::string_view value, size_t max_length,
                      bool slash) {
  if (value.empty() || value.size() > max_length) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " '", absl::CEscape(value),
                                                   "' has length ", value.size(), "; allowed 1 to ",
                                                   max_length));
  }
  if (value.front() == '.' || value.front() == '-' || value.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " '", absl::CEscape(value), "' must not start with '.', '-' or '/'"));
  }
  for (char c : value) {
    if (!Allowed(c, slash)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kind, " '", absl::CEscape(value), "' has character '", absl::CEscape(std::string(1, c)),
          "'; allowed letters, digits and . _ - :", slash ? " /" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobId(absl::string_view job_id) {
  return Validate("job id", job_id, 128, /*slash=*/false);
}

absl::Status ValidateName(absl::string_view kind, absl::string_view name) {
  return Validate(kind, name, 256, /*slash=*/true);
}

}  // namespace commd
