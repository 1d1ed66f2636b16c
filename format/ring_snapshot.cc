#include "format/ring_snapshot.h"

namespace commd {

const char* InvalidReasonName(InvalidReason reason) {
  static constexpr const char* kNames[kInvalidReasonCount] = {
      "unsettled",    "record_id", "state", "op",   "flags",
      "tensor_count", "dims",      "dtype", "name", "peer"};
  const auto i = static_cast<size_t>(reason);
  return i < kInvalidReasonCount ? kNames[i] : "unknown";
}

}  // namespace commd
