#include "daemon/server/handle_packet.h"

#include <climits>

#include "absl/strings/str_cat.h"

namespace commd::server {

absl::StatusOr<v1::HandleRequest> ParseHandlePacket(absl::string_view bytes, bool truncated,
                                                    size_t max_packet_bytes) {
  if (truncated) {
    return absl::InvalidArgumentError(absl::StrCat("packet exceeds ", max_packet_bytes, " bytes"));
  }
  v1::HandleRequest request;
  if (bytes.size() > static_cast<size_t>(INT_MAX) ||
      !request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) ||
      request.request_case() == v1::HandleRequest::REQUEST_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat("malformed packet of ", bytes.size(), " bytes"));
  }
  return request;
}

}  // namespace commd::server
