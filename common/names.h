// The rules for names clients choose: job ids, group names, buffer names. They end up in
// metric labels, logs and dump paths, so they are kept to a safe alphabet.
#ifndef COMMD_COMMON_NAMES_H_
#define COMMD_COMMON_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace commd {

// 1 to 128 of letters, digits and . _ - : ; not starting with '.' or '-'.
absl::Status ValidateJobId(absl::string_view job_id);

// A group or buffer name (`kind` says which in errors): 1 to 256 of letters, digits and
// . _ - : / ; not starting with '.', '-' or '/'.
absl::Status ValidateName(absl::string_view kind, absl::string_view name);

}  // namespace commd

#endif  // COMMD_COMMON_NAMES_H_
