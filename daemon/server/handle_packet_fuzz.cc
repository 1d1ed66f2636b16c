// Fuzz target for the fd channel's packet parser: any byte string is a packet from a client.
// Checks that parsing never crashes or reads out of bounds (ASan), that what parses has a
// request and survives a round trip, that errors never echo the packet, and that the names
// in a parsed request are validated without crashing and echoed within bounds.
//
//   libFuzzer (clang, -DCOMMD_FUZZ=ON):  handle_packet_fuzz -max_total_time=60 CORPUS SEEDS
//   seeds: tests/fixtures/handle_corpus
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/names.h"
#include "common/unix_socket.h"
#include "daemon/server/handle_packet.h"
#include "google/protobuf/stubs/logging.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// A validation error echoes at most kMaxEchoedBytes of the value, escaped (4 bytes each).
void CheckValidation(const absl::Status& s) {
  if (s.ok()) return;
  Check(s.code() == absl::StatusCode::kInvalidArgument);
  Check(s.message().size() < 4 * commd::kMaxEchoedBytes + 256);
}

}  // namespace

// Protobuf logs every string field with invalid UTF-8 it refuses; thousands of lines a
// second would bury libFuzzer's own output.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The first byte's low bit plays the kernel's truncation flag on some inputs.
  const bool truncated = size > 0 && size % 61 == 0 && (data[0] & 1) != 0;
  absl::StatusOr<commd::v1::HandleRequest> request =
      commd::server::ParseHandlePacket(bytes, truncated, commd::kMaxHandlePacketBytes);
  if (!request.ok()) {
    Check(request.status().code() == absl::StatusCode::kInvalidArgument);
    Check(request.status().message().size() < 64);  // the size only, never the bytes
    return 0;
  }
  Check(!truncated);
  Check(request->request_case() != commd::v1::HandleRequest::REQUEST_NOT_SET);
  const std::string again = request->SerializeAsString();
  absl::StatusOr<commd::v1::HandleRequest> reparsed =
      commd::server::ParseHandlePacket(again, false, commd::kMaxHandlePacketBytes);
  Check(reparsed.ok());
  Check(reparsed->SerializeAsString() == again);
  if (request->has_open_session()) {
    CheckValidation(commd::ValidateJobId(request->open_session().job_id()));
  }
  for (const std::string& token : request->import().tokens()) {
    Check(commd::QuoteForError(token).size() <= 4 * commd::kMaxEchoedBytes + 32);
  }
  return 0;
}
