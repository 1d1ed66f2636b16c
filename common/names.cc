#include "common/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace commd {
namespace {

bool Allowed(char c, bool slash) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == ':' || (slash && c == '/');
}

// "group name "a/b" is invalid: <why>".
absl::Status Invalid(absl::string_view kind, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(kind, " ", QuoteForError(value), " is invalid: ", why));
}

absl::Status Validate(absl::string_view kind, absl::string_view value, size_t max_length,
                      bool slash) {
  if (value.empty()) {
    return Invalid(kind, value, absl::StrCat("empty; allowed 1 to ", max_length, " bytes"));
  }
  if (value.size() > max_length) {
    return Invalid(kind, value, absl::StrCat("longer than ", max_length, " bytes"));
  }
  if (value.front() == '.' || value.front() == '-' || value.front() == '/') {
    return Invalid(kind, value, "must not start with '.', '-' or '/'");
  }
  for (size_t i = 0; i < value.size(); ++i) {
    if (!Allowed(value[i], slash)) {
      return Invalid(kind, value,
                     absl::StrCat("character '", absl::CEscape(value.substr(i, 1)), "' at byte ", i,
                                  "; allowed letters, digits and . _ - :", slash ? " /" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string QuoteForError(absl::string_view value) {
  if (value.size() <= kMaxEchoedBytes) return absl::StrCat("\"", absl::CEscape(value), "\"");
  return absl::StrCat("\"", absl::CEscape(value.substr(0, kMaxEchoedBytes)), "…\" (", value.size(),
                      " bytes)");
}

absl::Status ValidateJobId(absl::string_view job_id) {
  return Validate("job id", job_id, kMaxJobIdBytes, /*slash=*/false);
}

std::string JobIdRule() {
  return absl::StrCat("1 to ", kMaxJobIdBytes, " of letters, digits and . _ - :");
}

absl::Status ValidateName(absl::string_view kind, absl::string_view name) {
  return Validate(kind, name, kMaxNameBytes, /*slash=*/true);
}

}  // namespace commd
