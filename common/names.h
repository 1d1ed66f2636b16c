// The rules for names clients choose: job ids, group names, buffer names. They end up in
// metric labels, logs and dump paths, so they are kept to a safe alphabet. And how any value a
// client sent (a name, a key) is echoed into an error message.
#ifndef COMMD_COMMON_NAMES_H_
#define COMMD_COMMON_NAMES_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace commd {

// Bytes of a client's value that an error message echoes.
inline constexpr size_t kMaxEchoedBytes = 64;

// `value` quoted for an error message: "abc" when it is at most kMaxEchoedBytes long, else
// its first kMaxEchoedBytes and its length, "aaaa…" (8192 bytes); non-printable bytes are
// C-escaped. Error messages travel in gRPC trailers, which are bounded (8 KiB by default): a
// whole echo of a long value would turn the error into RESOURCE_EXHAUSTED "metadata size
// exceeds limit" and hide what was wrong. Pure.
std::string QuoteForError(absl::string_view value);

// The longest job id (also a node's name in the cluster, a dump's id) and the longest group
// or buffer name.
inline constexpr size_t kMaxJobIdBytes = 128;
inline constexpr size_t kMaxNameBytes = 256;

// 1 to kMaxJobIdBytes of letters, digits and . _ - : ; not starting with '.' or '-'.
absl::Status ValidateJobId(absl::string_view job_id);
// What ValidateJobId allows, for a message about a value that is held to it:
// "1 to 128 of letters, digits and . _ - :".
std::string JobIdRule();

// A group or buffer name (`kind` says which in errors): 1 to kMaxNameBytes of letters,
// digits and . _ - : / ; not starting with '.', '-' or '/'.
absl::Status ValidateName(absl::string_view kind, absl::string_view name);

}  // namespace commd

#endif  // COMMD_COMMON_NAMES_H_
