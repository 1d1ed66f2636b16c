#include "client/src/group_aborted.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace commd {

absl::Status GroupAbortedError(absl::string_view group, absl::string_view reason,
                               absl::string_view detail) {
  std::string text = absl::StrCat("group ", group, " aborted");
  if (!reason.empty()) absl::StrAppend(&text, " ", reason);
  if (!detail.empty()) absl::StrAppend(&text, " (", detail, ")");
  return absl::AbortedError(text);
}

}  // namespace commd
