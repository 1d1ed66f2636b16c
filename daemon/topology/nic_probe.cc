#include "daemon/topology/nic_probe.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/topology/pci_address.h"

namespace commd::topology {
namespace {

namespace fs = std::filesystem;

std::string ReadLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

std::vector<std::string> SortedEntries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The PCI function behind `device_link`: its target's last component, or for devices that
// sit below a PCI function (virtio0 under 0000:00:03.0) the nearest PCI ancestor.
std::string PciBusIdOf(const fs::path& device_link) {
  std::error_code ec;
  fs::path target = fs::read_symlink(device_link, ec);
  if (ec) return "";
  std::string id = NormalizePciBusId(target.filename().string());
  if (!id.empty()) return id;
  fs::path resolved = fs::canonical(device_link, ec);
  for (; !ec && resolved.has_relative_path(); resolved = resolved.parent_path()) {
    id = NormalizePciBusId(resolved.filename().string());
    if (!id.empty()) return id;
  }
  return "";
}

int NumaNodeOf(const fs::path& device_dir) {
  int node = -1;
  if (!absl::SimpleAtoi(ReadLine(device_dir / "numa_node"), &node) || node < 0) return -1;
  return node;
}

// "4: ACTIVE" -> "ACTIVE"; "200 Gb/sec (4X HDR)" -> 200000.
void ReadIbPort(const fs::path& port, v1::Nic* nic) {
  std::string state = ReadLine(port / "state");
  size_t colon = state.find(':');
  nic->set_state(colon == std::string::npos
                     ? state
                     : std::string(absl::StripAsciiWhitespace(state.substr(colon + 1))));
  std::vector<std::string> rate = absl::StrSplit(ReadLine(port / "rate"), ' ');
  double gbps = 0;
  if (!rate.empty() && absl::SimpleAtod(rate[0], &gbps) && gbps > 0) {
    nic->set_speed_mbps(static_cast<uint64_t>(gbps * 1000));
  }
}

v1::Nic ProbeIbDevice(const fs::path& dir, const std::string& name) {
  v1::Nic nic;
  nic.set_name(name);
  nic.set_kind("infiniband");
  nic.set_pci_bus_id(PciBusIdOf(dir / "device"));
  nic.set_numa_node(NumaNodeOf(dir / "device"));
  std::vector<std::string> ports = SortedEntries(dir / "ports");
  if (!ports.empty()) ReadIbPort(dir / "ports" / ports.front(), &nic);
  std::vector<std::string> netdevs = SortedEntries(dir / "device" / "net");
  if (!netdevs.empty()) nic.set_netdev(netdevs.front());
  return nic;
}

v1::Nic ProbeNetInterface(const fs::path& dir, const std::string& name) {
  v1::Nic nic;
  nic.set_name(name);
  nic.set_kind("ethernet");
  nic.set_pci_bus_id(PciBusIdOf(dir / "device"));
  nic.set_numa_node(NumaNodeOf(dir / "device"));
  nic.set_state(ReadLine(dir / "operstate"));
  // speed is in Mb/s, and -1 (or unreadable) while the link is down.
  int64_t speed = 0;
  if (absl::SimpleAtoi(ReadLine(dir / "speed"), &speed) && speed > 0) {
    nic.set_speed_mbps(static_cast<uint64_t>(speed));
  }
  return nic;
}

}  // namespace

std::vector<v1::Nic> ProbeNics(const std::string& sysfs_root, std::vector<std::string>* warnings) {
  std::vector<v1::Nic> nics;
  std::set<std::string> claimed_netdevs;
  const fs::path ib_dir = fs::path(sysfs_root) / "class" / "infiniband";
  for (const std::string& name : SortedEntries(ib_dir)) {
    v1::Nic nic = ProbeIbDevice(ib_dir / name, name);
    if (nic.pci_bus_id().empty()) {
      warnings->push_back(absl::StrCat("NIC ", name, ": no PCI device under ",
                                       (ib_dir / name / "device").string()));
    }
    if (!nic.netdev().empty()) claimed_netdevs.insert(nic.netdev());
    nics.push_back(std::move(nic));
  }
  const fs::path net_dir = fs::path(sysfs_root) / "class" / "net";
  for (const std::string& name : SortedEntries(net_dir)) {
    std::error_code ec;
    if (claimed_netdevs.count(name) > 0 || !fs::is_symlink(net_dir / name / "device", ec)) {
      continue;
    }
    nics.push_back(ProbeNetInterface(net_dir / name, name));
  }
  return nics;
}

}  // namespace commd::topology
