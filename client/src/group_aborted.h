// The one wording of a group's abort as the SDK's calls report it:
//   "group tp aborted stuck: collective 12 did not complete within 600000 ms"
// optionally followed by what the failed call itself saw, in parentheses.
#ifndef COMMD_CLIENT_SRC_GROUP_ABORTED_H_
#define COMMD_CLIENT_SRC_GROUP_ABORTED_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace commd {

// ABORTED "group <group> aborted <reason> (<detail>)": `reason` is the control block's abort
// reason in words (Group::abort_reason()); an empty `reason` or `detail` leaves its part out.
// Pure; thread-safe.
absl::Status GroupAbortedError(absl::string_view group, absl::string_view reason,
                               absl::string_view detail = {});

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_GROUP_ABORTED_H_
