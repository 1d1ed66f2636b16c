// A small pickle encoder (protocol 2) for JSON values: the format PyTorch's flight-recorder
// analyzer (torchfrtrace) loads with pickle.load, one dict per rank file.
//
//   ASSIGN_OR_RETURN(std::string bytes, EncodePickleFromJson(EncodeRankDumpJson(rank, options)));
//   // write `bytes` to "<dir>/<prefix><global_rank>"
//
// Mapping: object -> dict (str keys), array -> list, string -> str (UTF-8, which nlohmann
// strings are), integer (signed or unsigned 64-bit) -> int, float -> float, bool -> bool,
// null -> None. The stream uses no memo, so equal values are written twice rather than
// shared; pickle.load gives back plain dicts and lists, nothing else is ever constructed.
//
// Thread-safety: pure functions.
#ifndef COMMD_FORMAT_PICKLE_WRITER_H_
#define COMMD_FORMAT_PICKLE_WRITER_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace commd {

// File name of a rank's pickle, which torchfrtrace finds by prefix: "<prefix><global rank>".
inline constexpr char kTorchTracePrefix[] = "nccl_trace_rank_";

// INVALID_ARGUMENT for binary values, discarded values, or nesting deeper than 128.
absl::StatusOr<std::string> EncodePickle(const nlohmann::json& value);

// Decodes `json_text` (a rank's dump file, EncodeRankDumpJson's output) and encodes it as
// above: the pickle holds exactly what the JSON file says. INVALID_ARGUMENT for text that
// is not JSON (or not valid UTF-8), and as EncodePickle.
absl::StatusOr<std::string> EncodePickleFromJson(std::string_view json_text);

}  // namespace commd

#endif  // COMMD_FORMAT_PICKLE_WRITER_H_
