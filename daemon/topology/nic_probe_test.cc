#include "daemon/topology/nic_probe.h"

#include <fstream>

#include "daemon/topology/fake_sysfs.h"
#include "gtest/gtest.h"

namespace commd::topology {
namespace {

namespace fs = std::filesystem;

TEST(NicProbeTest, FindsInfinibandThenEthernetAndSkipsVirtualAndClaimedNetdevs) {
  TempDir sysfs;
  BuildFakeSysfs(sysfs.path(), ReadJsonFile(COMMD_TOPOLOGY_FIXTURES "/dgx_h100.nics.json"));
  std::vector<std::string> warnings;
  std::vector<v1::Nic> nics = ProbeNics(sysfs.path().string(), &warnings);
  EXPECT_TRUE(warnings.empty());
  ASSERT_EQ(nics.size(), 9u);  // mlx5_0..7 and eno1; not lo, docker0 or the IPoIB netdevs
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(nics[i].name(), "mlx5_" + std::to_string(i));
    EXPECT_EQ(nics[i].kind(), "infiniband");
    EXPECT_EQ(nics[i].numa_node(), i / 4);
    EXPECT_EQ(nics[i].speed_mbps(), 400000u);
    EXPECT_EQ(nics[i].state(), i == 3 ? "DOWN" : "ACTIVE");
  }
  EXPECT_EQ(nics[0].pci_bus_id(), "0000:14:00.0");
  EXPECT_EQ(nics[0].netdev(), "ibp20s0");
  EXPECT_EQ(nics[8].name(), "eno1");
  EXPECT_EQ(nics[8].kind(), "ethernet");
  EXPECT_EQ(nics[8].pci_bus_id(), "0000:01:00.0");
  EXPECT_EQ(nics[8].state(), "up");
  EXPECT_EQ(nics[8].speed_mbps(), 25000u);
  EXPECT_EQ(nics[8].netdev(), "");
}

// Real sysfs on a VM: class/net/eth0/device -> ../../../virtio2, a child of the PCI function.
TEST(NicProbeTest, WalksUpFromNonPciDeviceToItsPciFunction) {
  TempDir sysfs;
  const fs::path pci = sysfs.path() / "devices/pci0000:00/0000:00:03.0";
  fs::create_directories(pci / "virtio2/net/eth0");
  std::ofstream(pci / "numa_node") << "-1\n";
  fs::create_directories(sysfs.path() / "class/net");
  fs::create_symlink("../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0",
                     sysfs.path() / "class/net/eth0");
  fs::create_symlink("../../../virtio2", pci / "virtio2/net/eth0/device");
  std::ofstream(pci / "virtio2/net/eth0/operstate") << "up\n";
  std::ofstream(pci / "virtio2/net/eth0/speed") << "-1\n";
  std::vector<std::string> warnings;
  std::vector<v1::Nic> nics = ProbeNics(sysfs.path().string(), &warnings);
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].name(), "eth0");
  EXPECT_EQ(nics[0].pci_bus_id(), "0000:00:03.0");
  EXPECT_EQ(nics[0].numa_node(), -1);
  EXPECT_EQ(nics[0].speed_mbps(), 0u);  // -1: speed unknown
  EXPECT_EQ(nics[0].state(), "up");
}

TEST(NicProbeTest, NoClassDirectoriesMeansNoNics) {
  TempDir sysfs;
  std::vector<std::string> warnings;
  EXPECT_TRUE(ProbeNics((sysfs.path() / "missing").string(), &warnings).empty());
  EXPECT_TRUE(warnings.empty());
}

}  // namespace
}  // namespace commd::topology
