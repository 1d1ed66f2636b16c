#include "daemon/memory/memory_backend.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace commd::memory {

std::string Device::ToString() const {
  return kind == Kind::kHost ? "host" : absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "host") return Device::Host();
  absl::string_view rest = text;
  int index = -1;
  if (absl::ConsumePrefix(&rest, "cuda:") && !rest.empty() && rest.size() <= 4 &&
      absl::SimpleAtoi(rest, &index) && index >= 0 && index <= 1023 && rest[0] != '+') {
    return Device::Cuda(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", text, "'; allowed 'host' or 'cuda:N' with N from 0 to 1023"));
}

absl::StatusOr<Device> MemoryBackend::DeviceByUuid(absl::string_view uuid) const {
  return absl::FailedPreconditionError(
      absl::StrCat("device ", uuid, " asked for, but the ", name(), " backend has no devices"));
}

}  // namespace commd::memory
