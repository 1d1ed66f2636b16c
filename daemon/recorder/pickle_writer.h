// A small pickle encoder (protocol 2) for JSON values: the format PyTorch's flight-recorder
// analyzer (torchfrtrace) loads with pickle.load, one dict per rank file.
//
//   ASSIGN_OR_RETURN(std::string bytes, EncodePickle(EncodeRankDump(rank, options)));
//   // write `bytes` to "<dir>/<prefix><global_rank>"
//
// Mapping: object -> dict (str keys), array -> list, string -> str (UTF-8, which nlohmann
// strings are), integer (signed or unsigned 64-bit) -> int, float -> float, bool -> bool,
// null -> None. The stream uses no memo, so equal values are written twice rather than
// shared; pickle.load gives back plain dicts and lists, nothing else is ever constructed.
//
// Thread-safety: a pure function.
#ifndef COMMD_DAEMON_RECORDER_PICKLE_WRITER_H_
#define COMMD_DAEMON_RECORDER_PICKLE_WRITER_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace commd {

// INVALID_ARGUMENT for binary values, discarded values, or nesting deeper than 128.
absl::StatusOr<std::string> EncodePickle(const nlohmann::json& value);

}  // namespace commd

#endif  // COMMD_DAEMON_RECORDER_PICKLE_WRITER_H_
