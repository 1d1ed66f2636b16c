// PCI addresses (domain:bus:device.function) as NVML, sysfs and hwloc spell them, so devices
// found by different sources can be matched by one key.
//
//   std::optional<PciAddress> a = ParsePciBusId("00000000:1B:00.0");
//   FormatPciBusId(*a) == "0000:1b:00.0"
#ifndef COMMD_DAEMON_TOPOLOGY_PCI_ADDRESS_H_
#define COMMD_DAEMON_TOPOLOGY_PCI_ADDRESS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace commd::topology {

struct PciAddress {
  unsigned domain = 0;
  unsigned bus = 0;
  unsigned device = 0;
  unsigned function = 0;
};

// Accepts "dddd:bb:dd.f" with a domain of 1 to 8 hex digits, either case; also
// "bb:dd.f" (domain 0). nullopt for anything else or out-of-range parts.
std::optional<PciAddress> ParsePciBusId(absl::string_view text);

// "0000:1b:00.0": 4-digit domain (more when it needs them), lower case.
std::string FormatPciBusId(const PciAddress& address);

// FormatPciBusId(ParsePciBusId(text)), or "" when `text` does not parse.
std::string NormalizePciBusId(absl::string_view text);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_PCI_ADDRESS_H_
