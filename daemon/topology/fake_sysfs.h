// Test helper: builds a sysfs tree with the NIC entries nic_probe.cc reads, from a
// tests/fixtures/topologies/<machine>.nics.json list:
//
//   {"kind": "infiniband", "name": "mlx5_0", "bus_id": "0000:14:00.0", "numa_node": 0,
//    "state": "4: ACTIVE", "rate": "400 Gb/sec (4X NDR)", "netdev": "ibp20s0"}
//   {"kind": "ethernet", "name": "eno1", "bus_id": "0000:01:00.0", "operstate": "up",
//    "speed": "25000"}
//   {"kind": "virtual", "name": "lo"}
//
// Devices live in <root>/devices/pci<domain>:<bus>/<bus id>/ (numa_node, net/<netdev>/) and
// class/{net,infiniband}/<name>/device links point there relatively, as in real sysfs.
#ifndef COMMD_DAEMON_TOPOLOGY_FAKE_SYSFS_H_
#define COMMD_DAEMON_TOPOLOGY_FAKE_SYSFS_H_

#include <filesystem>
#include <string>

#include "nlohmann/json.hpp"

namespace commd::topology {

// A fresh directory under the test's temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes the tree for `nics` under `root`.
void BuildFakeSysfs(const std::filesystem::path& root, const nlohmann::json& nics);

// Parses the JSON file at `path`; fails the calling test (and returns null) when it cannot.
nlohmann::json ReadJsonFile(const std::string& path);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_FAKE_SYSFS_H_
