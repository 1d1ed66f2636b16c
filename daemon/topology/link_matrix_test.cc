#include "daemon/topology/link_matrix.h"

#include <vector>

#include "gtest/gtest.h"

namespace commd::topology {
namespace {

using Kind = PciHop::Kind;

// A device below `bridges` (nearest first, ids only; the last one is the host bridge).
PciLocation At(std::vector<uint64_t> bridges, int numa) {
  PciLocation l;
  l.found = true;
  for (size_t i = 0; i < bridges.size(); ++i) {
    l.bridges.push_back(
        {i + 1 == bridges.size() ? Kind::kHostBridge : Kind::kPciBridge, bridges[i]});
  }
  l.numa_node = numa;
  return l;
}

// Host bridge 100 holds root port 10 -> switch upstream 20 -> downstream ports 21, 22, 23;
// port 23 leads to a second switch 30 -> ports 31, 32. Root port 11 holds a device
// directly. Host bridge 200 is on the same NUMA node, 300 on another.
TEST(PciLinkTypeTest, FollowsNvidiaSmiVocabulary) {
  PciLocation under21 = At({21, 20, 10, 100}, 0);
  PciLocation under22 = At({22, 20, 10, 100}, 0);
  PciLocation under31 = At({31, 30, 23, 20, 10, 100}, 0);
  PciLocation under32 = At({32, 30, 23, 20, 10, 100}, 0);
  PciLocation under11 = At({11, 100}, 0);
  PciLocation other_host = At({40, 200}, 0);
  PciLocation other_numa = At({50, 300}, 1);

  EXPECT_EQ(PciLinkType(under21, under22), v1::LINK_PIX);  // one switch
  EXPECT_EQ(PciLinkType(under31, under32), v1::LINK_PIX);
  EXPECT_EQ(PciLinkType(under21, under31), v1::LINK_PXB);  // two switches
  EXPECT_EQ(PciLinkType(under31, under21), v1::LINK_PXB);
  EXPECT_EQ(PciLinkType(under21, under11), v1::LINK_PHB);
  EXPECT_EQ(PciLinkType(under31, other_host), v1::LINK_NODE);
  EXPECT_EQ(PciLinkType(under21, other_numa), v1::LINK_SYS);
}

TEST(PciLinkTypeTest, SameDownstreamPortIsPix) {
  EXPECT_EQ(PciLinkType(At({21, 20, 100}, 0), At({21, 20, 100}, 0)), v1::LINK_PIX);
}

TEST(PciLinkTypeTest, UnknownDeviceOrNumaIsSys) {
  PciLocation unknown;
  EXPECT_EQ(PciLinkType(At({21, 100}, 0), unknown), v1::LINK_SYS);
  // Two host bridges under a CPU side spanning several NUMA nodes: cannot say NODE.
  EXPECT_EQ(PciLinkType(At({21, 100}, -1), At({22, 200}, -1)), v1::LINK_SYS);
}

TEST(NvLinkCountTest, DirectLinksCountFromEitherSide) {
  GpuNvLinks a{"0000:01:00.0", {{"0000:02:00.0", 2}}, 0};
  GpuNvLinks b{"0000:02:00.0", {}, 0};  // b's queries failed
  EXPECT_EQ(NvLinkCount(a, b), 2u);
  EXPECT_EQ(NvLinkCount(b, a), 2u);
}

TEST(NvLinkCountTest, NvSwitchPairsUseTheThinnerSide) {
  GpuNvLinks a{"0000:01:00.0", {}, 18};
  GpuNvLinks b{"0000:02:00.0", {}, 16};
  GpuNvLinks pcie{"0000:03:00.0", {}, 0};
  EXPECT_EQ(NvLinkCount(a, b), 16u);
  EXPECT_EQ(NvLinkCount(b, a), 16u);
  EXPECT_EQ(NvLinkCount(a, pcie), 0u);
}

TEST(MakeLinkTest, Labels) {
  EXPECT_EQ(MakeLink(v1::LINK_SELF).label(), "X");
  EXPECT_EQ(MakeLink(v1::LINK_NVLINK, 18).label(), "NV18");
  EXPECT_EQ(MakeLink(v1::LINK_NVLINK, 18).nvlinks(), 18u);
  EXPECT_EQ(MakeLink(v1::LINK_PXB).label(), "PXB");
  EXPECT_EQ(MakeLink(v1::LINK_PXB).nvlinks(), 0u);
  EXPECT_EQ(MakeLink(v1::LINK_NODE).label(), "NODE");
}

// Builds a topology of `n` GPUs on one host bridge with NVLinks between `pairs`.
v1::Topology WithNvLinks(int n, const std::vector<std::pair<int, int>>& pairs) {
  std::vector<GpuNvLinks> nvlinks(n);
  std::vector<PciLocation> locations;
  for (int i = 0; i < n; ++i) {
    nvlinks[i].pci_bus_id = "0000:0" + std::to_string(i) + ":00.0";
    locations.push_back(At({static_cast<uint64_t>(10 + i), 100}, 0));
  }
  for (auto [a, b] : pairs) nvlinks[a].peers[nvlinks[b].pci_bus_id] = 1;
  v1::Topology t;
  FillLinkMatrices(nvlinks, locations, {At({99, 100}, 0)}, &t);
  return t;
}

TEST(FillLinkMatricesTest, FillsEveryCell) {
  v1::Topology t = WithNvLinks(3, {{0, 1}});
  ASSERT_EQ(t.gpu_links_size(), 3);
  const char* expected[3][3] = {{"X", "NV1", "PHB"}, {"NV1", "X", "PHB"}, {"PHB", "PHB", "X"}};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(t.gpu_links(i).links_size(), 3);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(t.gpu_links(i).links(j).label(), expected[i][j]);
    ASSERT_EQ(t.gpu_nic_links(i).links_size(), 1);
    EXPECT_EQ(t.gpu_nic_links(i).links(0).type(), v1::LINK_PHB);
  }
  ASSERT_EQ(t.nic_links_size(), 1);
  EXPECT_EQ(t.nic_links(0).links(0).type(), v1::LINK_SELF);
}

// A lost GPU keeps its NVLink facts and PCI place from before, but no path to it works.
TEST(FillLinkMatricesTest, LostGpuIsLostInItsRowAndColumn) {
  std::vector<GpuNvLinks> nvlinks(3);
  std::vector<PciLocation> locations;
  for (int i = 0; i < 3; ++i) {
    nvlinks[i].pci_bus_id = "0000:0" + std::to_string(i) + ":00.0";
    nvlinks[i].switch_links = 18;
    locations.push_back(At({static_cast<uint64_t>(10 + i), 100}, 0));
  }
  nvlinks[1].lost = true;
  v1::Topology t;
  FillLinkMatrices(nvlinks, locations, {At({99, 100}, 0)}, &t);
  const char* expected[3][3] = {
      {"X", "LOST", "NV18"}, {"LOST", "X", "LOST"}, {"NV18", "LOST", "X"}};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(t.gpu_links(i).links(j).label(), expected[i][j]);
  }
  EXPECT_EQ(t.gpu_links(0).links(1).type(), v1::LINK_LOST);
  EXPECT_EQ(t.gpu_links(0).links(1).nvlinks(), 0u);
  EXPECT_EQ(t.gpu_nic_links(0).links(0).type(), v1::LINK_PHB);
  EXPECT_EQ(t.gpu_nic_links(1).links(0).type(), v1::LINK_LOST);
  EXPECT_EQ(Classify(t), v1::PARTIAL);
}

TEST(ClassifyTest, Classes) {
  EXPECT_EQ(Classify(WithNvLinks(0, {})), v1::NONE);
  EXPECT_EQ(Classify(WithNvLinks(1, {})), v1::NONE);
  EXPECT_EQ(Classify(WithNvLinks(4, {})), v1::NONE);
  EXPECT_EQ(Classify(WithNvLinks(2, {{0, 1}})), v1::FULLY_CONNECTED);
  EXPECT_EQ(Classify(WithNvLinks(4, {{0, 1}, {2, 3}})), v1::PARTIAL);
  EXPECT_EQ(Classify(WithNvLinks(4, {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}})),
            v1::FULLY_CONNECTED);
  // The DGX-1 cube mesh: two fully linked quads, plus i <-> i+4.
  std::vector<std::pair<int, int>> mesh;
  for (int q = 0; q < 8; q += 4) {
    for (int a = q; a < q + 4; ++a) {
      for (int b = a + 1; b < q + 4; ++b) mesh.push_back({a, b});
    }
  }
  for (int i = 0; i < 4; ++i) mesh.push_back({i, i + 4});
  EXPECT_EQ(Classify(WithNvLinks(8, mesh)), v1::HYBRID_CUBE_MESH);
  mesh.pop_back();  // GPU3 and GPU7 now have 3 neighbours
  EXPECT_EQ(Classify(WithNvLinks(8, mesh)), v1::PARTIAL);
}

}  // namespace
}  // namespace commd::topology
