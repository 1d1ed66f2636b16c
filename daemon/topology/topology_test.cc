#include "daemon/topology/topology.h"

#include <stdlib.h>

#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/topology/fake_sysfs.h"
#include "gtest/gtest.h"

namespace commd::topology {
namespace {

const std::string kFixtures = COMMD_TOPOLOGY_FIXTURES;

// What each fixture machine must come out as. Matrices are written by hand from the machine's
// description in tests/fixtures/topologies/gen_topologies.py, one string per row.
struct Expected {
  std::string name;
  std::string hostname;
  v1::TopologyClass classification;
  unsigned packages, cores, pus, pci_devices, nvswitches;
  std::vector<std::string> numa_cpus;  // per NUMA node
  std::vector<int> gpu_numa;           // per GPU
  std::vector<unsigned> gpu_nvlinks;   // active NVLinks per GPU
  std::vector<std::string> nic_names;
  std::vector<int> nic_numa;
  std::vector<std::string> gpu_links, gpu_nic_links, nic_links;
};

const Expected kDgxH100 = {
    "dgx_h100",
    "dgx-h100",
    v1::FULLY_CONNECTED,
    2,
    112,
    224,
    18,
    4,
    {"0-55,112-167", "56-111,168-223"},
    {0, 0, 0, 0, 1, 1, 1, 1},
    {18, 18, 18, 18, 18, 18, 18, 16},
    {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "eno1"},
    {0, 0, 0, 0, 1, 1, 1, 1, 0},
    {
        "X NV18 NV18 NV18 NV18 NV18 NV18 NV16",
        "NV18 X NV18 NV18 NV18 NV18 NV18 NV16",
        "NV18 NV18 X NV18 NV18 NV18 NV18 NV16",
        "NV18 NV18 NV18 X NV18 NV18 NV18 NV16",
        "NV18 NV18 NV18 NV18 X NV18 NV18 NV16",
        "NV18 NV18 NV18 NV18 NV18 X NV18 NV16",
        "NV18 NV18 NV18 NV18 NV18 NV18 X NV16",
        "NV16 NV16 NV16 NV16 NV16 NV16 NV16 X",
    },
    {
        "PIX NODE NODE NODE SYS SYS SYS SYS NODE",
        "NODE PIX NODE NODE SYS SYS SYS SYS NODE",
        "NODE NODE PIX NODE SYS SYS SYS SYS NODE",
        "NODE NODE NODE PIX SYS SYS SYS SYS NODE",
        "SYS SYS SYS SYS PIX NODE NODE NODE SYS",
        "SYS SYS SYS SYS NODE PIX NODE NODE SYS",
        "SYS SYS SYS SYS NODE NODE PIX NODE SYS",
        "SYS SYS SYS SYS NODE NODE NODE PIX SYS",
    },
    {
        "X NODE NODE NODE SYS SYS SYS SYS NODE",
        "NODE X NODE NODE SYS SYS SYS SYS NODE",
        "NODE NODE X NODE SYS SYS SYS SYS NODE",
        "NODE NODE NODE X SYS SYS SYS SYS NODE",
        "SYS SYS SYS SYS X NODE NODE NODE SYS",
        "SYS SYS SYS SYS NODE X NODE NODE SYS",
        "SYS SYS SYS SYS NODE NODE X NODE SYS",
        "SYS SYS SYS SYS NODE NODE NODE X SYS",
        "NODE NODE NODE NODE SYS SYS SYS SYS X",
    },
};

const Expected kDgx1V100 = {
    "dgx1_v100",
    "dgx1-v100",
    v1::HYBRID_CUBE_MESH,
    2,
    40,
    80,
    12,
    0,
    {"0-19,40-59", "20-39,60-79"},
    {0, 0, 0, 0, 1, 1, 1, 1},
    {6, 6, 6, 6, 6, 6, 6, 6},
    {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"},
    {0, 0, 1, 1},
    {
        "X NV1 NV1 NV2 NV2 SYS SYS SYS",
        "NV1 X NV2 NV1 SYS NV2 SYS SYS",
        "NV1 NV2 X NV2 SYS SYS NV1 SYS",
        "NV2 NV1 NV2 X SYS SYS SYS NV1",
        "NV2 SYS SYS SYS X NV1 NV1 NV2",
        "SYS NV2 SYS SYS NV1 X NV2 NV1",
        "SYS SYS NV1 SYS NV1 NV2 X NV2",
        "SYS SYS SYS NV1 NV2 NV1 NV2 X",
    },
    {
        "PIX PHB SYS SYS",
        "PIX PHB SYS SYS",
        "PHB PIX SYS SYS",
        "PHB PIX SYS SYS",
        "SYS SYS PIX PHB",
        "SYS SYS PIX PHB",
        "SYS SYS PHB PIX",
        "SYS SYS PHB PIX",
    },
    {
        "X PHB SYS SYS",
        "PHB X SYS SYS",
        "SYS SYS X PHB",
        "SYS SYS PHB X",
    },
};

const Expected kNvlinkPairs = {
    "nvlink_pairs",
    "workstation",
    v1::PARTIAL,
    1,
    16,
    32,
    7,
    0,
    {"0-31"},
    {0, 0, 0, 0},
    {4, 4, 4, 4},
    {"eno1", "ens1f0"},
    {0, 0},
    {
        "X NV4 PHB PHB",
        "NV4 X PHB PHB",
        "PHB PHB X NV4",
        "PHB PHB NV4 X",
    },
    {
        "PHB PHB",
        "PHB PHB",
        "PHB PIX",
        "PHB PIX",
    },
    {
        "X PHB",
        "PHB X",
    },
};

const Expected kPcieTwoSocket = {
    "pcie_two_socket",
    "pcie-node",
    v1::NONE,
    2,
    64,
    64,
    11,
    0,
    {"0-31", "32-63"},
    {0, 0, 0, 0, 0, 1, 1, 1},
    {0, 0, 0, 0, 0, 0, 0, 0},
    {"mlx5_0", "ens3f0"},
    {0, 1},  // ens3f0's sysfs says -1: hwloc's answer
    {
        "X PIX PXB PHB NODE SYS SYS SYS",
        "PIX X PXB PHB NODE SYS SYS SYS",
        "PXB PXB X PHB NODE SYS SYS SYS",
        "PHB PHB PHB X NODE SYS SYS SYS",
        "NODE NODE NODE NODE X SYS SYS SYS",
        "SYS SYS SYS SYS SYS X PIX NODE",
        "SYS SYS SYS SYS SYS PIX X NODE",
        "SYS SYS SYS SYS SYS NODE NODE X",
    },
    {
        "PXB SYS",
        "PXB SYS",
        "PIX SYS",
        "PHB SYS",
        "NODE SYS",
        "SYS PIX",
        "SYS PIX",
        "SYS NODE",
    },
    {
        "X SYS",
        "SYS X",
    },
};

const Expected kNoGpu = {
    "no_gpu",
    "cpu-node",
    v1::NONE,
    1,
    24,
    48,
    3,
    0,
    {"0-11,24-35", "12-23,36-47"},
    {},
    {},
    {"mlx5_0", "eno1"},
    {1, 0},  // eno1 has no numa_node file: hwloc's answer
    {},
    {},
    {
        "X SYS",
        "SYS X",
    },
};

// Names the fixture instead of dumping its bytes when a test fails.
void PrintTo(const Expected& e, std::ostream* os) { *os << e.name; }

std::string Labels(const v1::LinkRow& row) {
  std::vector<std::string> labels;
  for (const v1::Link& link : row.links()) {
    labels.push_back(link.label());
    // The label must agree with the type (and count) it names.
    EXPECT_EQ(link.label(), LinkLabel(link));
  }
  return absl::StrJoin(labels, " ");
}

void ExpectMatrix(const google::protobuf::RepeatedPtrField<v1::LinkRow>& rows,
                  const std::vector<std::string>& expected, const char* what) {
  ASSERT_EQ(rows.size(), static_cast<int>(expected.size())) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(Labels(rows.Get(i)), expected[i]) << what << " row " << i;
  }
}

class TopologyTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("COMMD_NVML_LIBRARY"); }
  void TearDown() override {
    unsetenv("COMMD_FAKE_NVML_CONFIG");
    unsetenv("COMMD_NVML_LIBRARY");
  }

  // Config for fixture `name`: its XML, a fake sysfs built from its NIC list, and the fake
  // NVML reading `nvml_json` (the fixture's own description when null).
  v1::TopologyConfig FixtureConfig(const std::string& name,
                                   const nlohmann::json* nvml_json = nullptr) {
    BuildFakeSysfs(dir_.path() / "sys", ReadJsonFile(kFixtures + "/" + name + ".nics.json"));
    std::string nvml_path = kFixtures + "/" + name + ".nvml.json";
    if (nvml_json != nullptr) {
      nvml_path = (dir_.path() / "nvml.json").string();
      std::ofstream(nvml_path) << nvml_json->dump();
    }
    setenv("COMMD_FAKE_NVML_CONFIG", nvml_path.c_str(), 1);
    v1::TopologyConfig config;
    config.set_hwloc_xml(kFixtures + "/" + name + ".xml");
    config.set_sysfs_root((dir_.path() / "sys").string());
    config.set_nvml_library(COMMD_FAKE_NVML);
    return config;
  }

  // The fixture's NVML description with `failures` injected.
  nlohmann::json WithFailures(const std::string& name, nlohmann::json failures) {
    nlohmann::json j = ReadJsonFile(kFixtures + "/" + name + ".nvml.json");
    j["failures"] = std::move(failures);
    return j;
  }

  TempDir dir_;
};

class FixtureTest : public TopologyTest, public ::testing::WithParamInterface<Expected> {};

TEST_P(FixtureTest, MatchesTheMachine) {
  const Expected& e = GetParam();
  v1::Topology t = DiscoverTopology(FixtureConfig(e.name));
  EXPECT_EQ(t.nvml_status(), "ok");
  EXPECT_TRUE(t.warnings().empty()) << absl::StrJoin(t.warnings(), "\n");
  EXPECT_EQ(t.hostname(), e.hostname);
  EXPECT_EQ(t.classification(), e.classification) << v1::TopologyClass_Name(t.classification());
  EXPECT_EQ(t.packages(), e.packages);
  EXPECT_EQ(t.cores(), e.cores);
  EXPECT_EQ(t.pus(), e.pus);
  EXPECT_EQ(t.pci_devices(), e.pci_devices);
  EXPECT_EQ(t.nvswitches(), e.nvswitches);
  ASSERT_EQ(t.numa_nodes_size(), static_cast<int>(e.numa_cpus.size()));
  for (int n = 0; n < t.numa_nodes_size(); ++n) {
    EXPECT_EQ(t.numa_nodes(n).os_index(), static_cast<unsigned>(n));
    EXPECT_EQ(t.numa_nodes(n).cpus(), e.numa_cpus[n]) << "NUMA node " << n;
    EXPECT_GT(t.numa_nodes(n).memory_bytes(), 0u);
  }
  ASSERT_EQ(t.gpus_size(), static_cast<int>(e.gpu_numa.size()));
  for (int i = 0; i < t.gpus_size(); ++i) {
    const v1::Gpu& gpu = t.gpus(i);
    EXPECT_EQ(gpu.index(), static_cast<unsigned>(i));
    EXPECT_EQ(gpu.numa_node(), e.gpu_numa[i]) << "GPU " << i;
    // In these machines a GPU is local to a whole NUMA node's CPUs.
    EXPECT_EQ(gpu.cpu_affinity(), e.numa_cpus[e.gpu_numa[i]]) << "GPU " << i;
    EXPECT_EQ(gpu.nvlinks_active(), e.gpu_nvlinks[i]) << "GPU " << i;
    EXPECT_FALSE(gpu.name().empty());
    EXPECT_TRUE(absl::StartsWith(gpu.uuid(), "GPU-")) << gpu.uuid();
    EXPECT_EQ(gpu.pci_bus_id().size(), 12u) << gpu.pci_bus_id();  // 0000:1b:00.0
  }
  ASSERT_EQ(t.nics_size(), static_cast<int>(e.nic_names.size()));
  for (int k = 0; k < t.nics_size(); ++k) {
    EXPECT_EQ(t.nics(k).name(), e.nic_names[k]);
    EXPECT_EQ(t.nics(k).numa_node(), e.nic_numa[k]) << t.nics(k).name();
    EXPECT_FALSE(t.nics(k).pci_bus_id().empty());
  }
  ExpectMatrix(t.gpu_links(), e.gpu_links, "gpu_links");
  ExpectMatrix(t.gpu_nic_links(), e.gpu_nic_links, "gpu_nic_links");
  ExpectMatrix(t.nic_links(), e.nic_links, "nic_links");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         ::testing::Values(kDgxH100, kDgx1V100, kNvlinkPairs, kPcieTwoSocket,
                                           kNoGpu),
                         [](const auto& info) { return info.param.name; });

TEST_F(TopologyTest, FailedNvmlCallsAreWarningsAndTheRestComesBack) {
  nlohmann::json failures = {
      {{"call", "nvmlDeviceGetName"}, {"device", 3}, {"error", "NVML_ERROR_UNKNOWN"}},
      {{"call", "nvmlDeviceGetNvLinkRemoteDeviceType"}, {"device", 5}, {"error", 999}}};
  nlohmann::json nvml = WithFailures("dgx_h100", failures);
  v1::TopologyConfig config = FixtureConfig("dgx_h100", &nvml);
  ::testing::internal::CaptureStderr();
  v1::Topology t = DiscoverTopology(config);
  std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(t.nvml_status(), "ok");
  ASSERT_EQ(t.warnings_size(), 2) << absl::StrJoin(t.warnings(), "\n");
  EXPECT_EQ(t.warnings(0), "GPU 3: nvmlDeviceGetName: Unknown Error (NVML 999)");
  EXPECT_EQ(t.warnings(1),
            "GPU 5 link 0: nvmlDeviceGetNvLinkRemoteDeviceType: Unknown Error (NVML 999) "
            "(later failures of this call on this GPU not listed)");
  EXPECT_TRUE(absl::StrContains(log, "GPU 3: nvmlDeviceGetName: Unknown Error")) << log;
  EXPECT_TRUE(absl::StrContains(log, "topology")) << log;

  // GPU 3 lost its name only.
  ASSERT_EQ(t.gpus_size(), 8);
  EXPECT_EQ(t.gpus(3).name(), "");
  EXPECT_EQ(t.gpus(3).pci_bus_id(), "0000:43:00.0");
  EXPECT_EQ(t.gpus(3).nvlinks_active(), 18u);
  // GPU 5's links are up but lead nowhere known, so its row falls back to PCIe.
  EXPECT_EQ(t.gpus(5).nvlinks_active(), 18u);
  EXPECT_EQ(Labels(t.gpu_links(5)), "SYS SYS SYS SYS NODE X NODE NODE");
  EXPECT_EQ(Labels(t.gpu_links(0)), "X NV18 NV18 NV18 NV18 SYS NV18 NV16");
  EXPECT_EQ(t.classification(), v1::PARTIAL);
  EXPECT_EQ(t.nvswitches(), 4u);
  EXPECT_EQ(t.nics_size(), 9);
  EXPECT_EQ(t.pus(), 224u);
}

// A peer that could not be read from one side still shows from the other.
TEST_F(TopologyTest, OneSidedNvLinkFailureKeepsTheMatrix) {
  nlohmann::json nvml = WithFailures("dgx1_v100", {{{"call", "nvmlDeviceGetNvLinkRemotePciInfo_v2"},
                                                    {"device", 0},
                                                    {"error", "NVML_ERROR_UNKNOWN"}}});
  v1::Topology t = DiscoverTopology(FixtureConfig("dgx1_v100", &nvml));
  EXPECT_EQ(t.warnings_size(), 1);
  ExpectMatrix(t.gpu_links(), kDgx1V100.gpu_links, "gpu_links");
  EXPECT_EQ(t.classification(), v1::HYBRID_CUBE_MESH);
}

TEST_F(TopologyTest, FailedNvmlInitStillReportsCpusAndNics) {
  nlohmann::json nvml =
      WithFailures("dgx_h100", {{{"call", "nvmlInit_v2"}, {"error", "NVML_ERROR_UNKNOWN"}}});
  v1::Topology t = DiscoverTopology(FixtureConfig("dgx_h100", &nvml));
  EXPECT_EQ(t.nvml_status(), "NVML failed: nvmlInit_v2: Unknown Error (NVML 999)");
  EXPECT_EQ(t.gpus_size(), 0);
  EXPECT_EQ(t.pus(), 224u);
  EXPECT_EQ(t.nics_size(), 9);
  EXPECT_EQ(t.classification(), v1::NONE);
  ASSERT_EQ(t.warnings_size(), 1);
  EXPECT_EQ(t.warnings(0), t.nvml_status());
}

TEST_F(TopologyTest, MissingNvmlLibraryMeansNoDriver) {
  v1::TopologyConfig config = FixtureConfig("pcie_two_socket");
  config.set_nvml_library("/nonexistent/libnvidia-ml.so.1");
  v1::Topology t = DiscoverTopology(config);
  EXPECT_TRUE(absl::StartsWith(t.nvml_status(), "no NVIDIA driver: cannot load "))
      << t.nvml_status();
  EXPECT_TRUE(absl::StrContains(t.nvml_status(), "/nonexistent/libnvidia-ml.so.1"));
  EXPECT_TRUE(t.warnings().empty()) << absl::StrJoin(t.warnings(), "\n");
  EXPECT_EQ(t.gpus_size(), 0);
  EXPECT_EQ(t.gpu_links_size(), 0);
  EXPECT_EQ(t.classification(), v1::NONE);
  EXPECT_EQ(t.pus(), 64u);
  EXPECT_EQ(t.numa_nodes_size(), 2);
  EXPECT_EQ(t.pci_devices(), 11u);
  ASSERT_EQ(t.nics_size(), 2);
  ExpectMatrix(t.nic_links(), kPcieTwoSocket.nic_links, "nic_links");
}

TEST_F(TopologyTest, EnvironmentOverridesConfiguredLibrary) {
  v1::TopologyConfig config = FixtureConfig("nvlink_pairs");
  config.set_nvml_library("/nonexistent/libnvidia-ml.so.1");
  setenv("COMMD_NVML_LIBRARY", COMMD_FAKE_NVML, 1);
  EXPECT_EQ(NvmlLibraryPath(config), COMMD_FAKE_NVML);
  v1::Topology t = DiscoverTopology(config);
  EXPECT_EQ(t.nvml_status(), "ok");
  EXPECT_EQ(t.gpus_size(), 4);
  EXPECT_EQ(t.driver_version(), "550.54.15");
}

TEST_F(TopologyTest, DefaultLibraryName) {
  EXPECT_EQ(NvmlLibraryPath(v1::TopologyConfig()), "libnvidia-ml.so.1");
}

TEST_F(TopologyTest, UnreadableXmlIsAWarning) {
  v1::TopologyConfig config = FixtureConfig("nvlink_pairs");
  config.set_hwloc_xml((dir_.path() / "missing.xml").string());
  v1::Topology t = DiscoverTopology(config);
  ASSERT_GE(t.warnings_size(), 1);
  EXPECT_TRUE(absl::StrContains(t.warnings(0), "missing.xml")) << t.warnings(0);
  EXPECT_EQ(t.pus(), 0u);
  // NVML and sysfs still answer; without a PCI tree every link is SYS.
  EXPECT_EQ(t.gpus_size(), 4);
  EXPECT_EQ(t.nics_size(), 2);
  EXPECT_EQ(Labels(t.gpu_links(0)), "X NV4 SYS SYS");
  EXPECT_EQ(t.classification(), v1::PARTIAL);
}

// This machine, as the daemon sees it with the default config (no XML, /sys).
TEST_F(TopologyTest, LiveMachineWithoutDriverStillReportsCpusNumaAndPci) {
  v1::TopologyConfig config;
  config.set_sysfs_root("/sys");
  v1::Topology t = DiscoverTopology(config);
  EXPECT_FALSE(t.hostname().empty());
  EXPECT_GE(t.packages(), 1u);
  EXPECT_GE(t.cores(), 1u);
  EXPECT_GE(t.pus(), t.cores());
  ASSERT_GE(t.numa_nodes_size(), 1);
  for (const v1::NumaNode& node : t.numa_nodes()) EXPECT_FALSE(node.cpus().empty());
  for (const v1::Nic& nic : t.nics()) EXPECT_NE(nic.name(), "lo");
  if (t.nvml_status() != "ok") {
    EXPECT_TRUE(absl::StartsWith(t.nvml_status(), "no NVIDIA driver: ")) << t.nvml_status();
    EXPECT_EQ(t.gpus_size(), 0);
    EXPECT_EQ(t.classification(), v1::NONE);
  }
  // The renderer copes with whatever the machine is.
  EXPECT_TRUE(absl::StrContains(RenderTopologyText(t), "NVML: " + t.nvml_status()));
}

TEST_F(TopologyTest, LiveMachineWithMissingLibrary) {
  v1::TopologyConfig config;
  config.set_nvml_library("/nonexistent/libnvidia-ml.so.1");
  v1::Topology t = DiscoverTopology(config);
  EXPECT_TRUE(absl::StartsWith(t.nvml_status(), "no NVIDIA driver: cannot load "))
      << t.nvml_status();
  EXPECT_EQ(t.gpus_size(), 0);
  EXPECT_GE(t.pus(), 1u);
  EXPECT_GE(t.numa_nodes_size(), 1);
  EXPECT_EQ(t.gpu_links_size(), 0);
  EXPECT_EQ(t.nic_links_size(), t.nics_size());
}

// NVML answers GPU_IS_LOST for GPU 3 (as after an Xid 79): it stays in the report, marked
// lost, and every cell of its row and column says LOST, never a PCIe or SMP path.
TEST_F(TopologyTest, LostGpuIsLostNotAPath) {
  nlohmann::json nvml = ReadJsonFile(kFixtures + "/dgx_h100.nvml.json");
  nvml["devices"][3]["lost"] = true;
  v1::Topology t = DiscoverTopology(FixtureConfig("dgx_h100", &nvml));
  EXPECT_EQ(t.nvml_status(), "ok");
  ASSERT_EQ(t.gpus_size(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(t.gpus(i).lost(), i == 3) << i;
  EXPECT_EQ(t.gpus(3).name(), "");
  EXPECT_EQ(t.gpus(3).nvlinks_active(), 0u);
  ASSERT_EQ(t.warnings_size(), 1) << absl::StrJoin(t.warnings(), "\n");
  EXPECT_TRUE(absl::StartsWith(t.warnings(0),
                               "GPU 3: lost: nvmlDeviceGetName: GPU is lost (NVML 15); it fell off "
                               "the bus or stopped answering"))
      << t.warnings(0);
  EXPECT_EQ(Labels(t.gpu_links(3)), "LOST LOST LOST X LOST LOST LOST LOST");
  EXPECT_EQ(Labels(t.gpu_links(0)), "X NV18 NV18 LOST NV18 NV18 NV18 NV16");
  for (const v1::Link& link : t.gpu_nic_links(3).links()) EXPECT_EQ(link.type(), v1::LINK_LOST);
  EXPECT_EQ(Labels(t.gpu_nic_links(2)), kDgxH100.gpu_nic_links[2]);
  EXPECT_EQ(t.classification(), v1::PARTIAL);

  const std::string text = RenderTopologyText(t);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ASSERT_GT(lines.size(), 5u);
  EXPECT_TRUE(absl::StartsWith(lines[4], "GPU3  LOST  LOST  LOST   X    LOST")) << text;
  EXPECT_FALSE(absl::StrContains(lines[4], "SYS")) << text;
  EXPECT_TRUE(absl::StrContains(lines[1], "NV18  LOST  NV18")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\nGPU3 is LOST: NVML reports it lost")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  LOST = GPU that NVML reports lost: no path\n")) << text;
}

TEST_F(TopologyTest, RendersFixtureText) {
  std::string text = RenderTopologyText(DiscoverTopology(FixtureConfig("dgx_h100")));
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ASSERT_GT(lines.size(), 18u);
  EXPECT_TRUE(absl::StartsWith(lines[0], "      GPU0  GPU1")) << text;
  EXPECT_TRUE(absl::StrContains(lines[0], "NIC8  CPU Affinity    NUMA Affinity")) << text;
  EXPECT_TRUE(absl::StartsWith(lines[1], "GPU0   X    NV18")) << text;
  EXPECT_TRUE(absl::StrContains(lines[1], "0-55,112-167    0")) << text;
  EXPECT_TRUE(absl::StartsWith(lines[9], "NIC0  PIX ")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  NIC8: eno1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "Topology: FULLY_CONNECTED (4 NVSwitches)\n")) << text;
}

}  // namespace
}  // namespace commd::topology
