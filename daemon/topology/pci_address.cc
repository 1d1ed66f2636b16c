#include "daemon/topology/pci_address.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace commd::topology {
namespace {

bool ParseHex(absl::string_view text, size_t max_digits, unsigned max_value, unsigned* out) {
  if (text.empty() || text.size() > max_digits) return false;
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  uint32_t value = 0;
  if (!absl::SimpleHexAtoi(text, &value) || value > max_value) return false;
  *out = value;
  return true;
}

}  // namespace

std::optional<PciAddress> ParsePciBusId(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0");
  if (parts.size() != 3) return std::nullopt;
  std::vector<absl::string_view> dev_fn = absl::StrSplit(parts[2], '.');
  if (dev_fn.size() != 2) return std::nullopt;
  PciAddress a;
  if (!ParseHex(parts[0], 8, 0xffffffffu, &a.domain) || !ParseHex(parts[1], 2, 0xff, &a.bus) ||
      !ParseHex(dev_fn[0], 2, 0x1f, &a.device) || !ParseHex(dev_fn[1], 1, 7, &a.function)) {
    return std::nullopt;
  }
  return a;
}

std::string FormatPciBusId(const PciAddress& a) {
  return absl::StrFormat("%04x:%02x:%02x.%x", a.domain, a.bus, a.device, a.function);
}

std::string NormalizePciBusId(absl::string_view text) {
  std::optional<PciAddress> a = ParsePciBusId(text);
  return a ? FormatPciBusId(*a) : std::string();
}

}  // namespace commd::topology
