// The fd channel's packet parser, apart from sockets and sessions so that it is pure and a
// fuzzer (handle_packet_fuzz.cc) can give it any bytes.
//
//   absl::StatusOr<v1::HandleRequest> request =
//       ParseHandlePacket(message.bytes, message.truncated, options.max_packet_bytes);
//   if (!request.ok()) Drop(fd, request.status().message());
#ifndef COMMD_DAEMON_SERVER_HANDLE_PACKET_H_
#define COMMD_DAEMON_SERVER_HANDLE_PACKET_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "commd/v1/handles.pb.h"

namespace commd::server {

// One packet as received: `bytes`, and whether the kernel cut it at `max_packet_bytes`.
// INVALID_ARGUMENT for a cut packet, bytes that are no HandleRequest, or a HandleRequest with
// no request set; the message gives the packet's size, never its bytes. Pure; thread-safe.
absl::StatusOr<v1::HandleRequest> ParseHandlePacket(absl::string_view bytes, bool truncated,
                                                    size_t max_packet_bytes);

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_HANDLE_PACKET_H_
