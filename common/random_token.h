// Unguessable tokens (128 bits from getrandom, hex) for session and import tokens.
#ifndef COMMD_COMMON_RANDOM_TOKEN_H_
#define COMMD_COMMON_RANDOM_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"

namespace commd {

absl::StatusOr<std::string> RandomToken();

}  // namespace commd

#endif  // COMMD_COMMON_RANDOM_TOKEN_H_
