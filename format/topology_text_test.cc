#include "format/topology_text.h"

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace commd::topology {
namespace {

v1::Link L(v1::LinkType type, unsigned nvlinks = 0) {
  v1::Link link;
  link.set_type(type);
  link.set_nvlinks(nvlinks);
  link.set_label(LinkLabel(link));
  return link;
}

void AddRow(google::protobuf::RepeatedPtrField<v1::LinkRow>* rows, std::vector<v1::Link> links) {
  v1::LinkRow* row = rows->Add();
  for (v1::Link& l : links) *row->add_links() = l;
}

TEST(LinkLabelTest, AllTypes) {
  EXPECT_EQ(LinkLabel(L(v1::LINK_SELF)), "X");
  EXPECT_EQ(LinkLabel(L(v1::LINK_NVLINK, 4)), "NV4");
  EXPECT_EQ(LinkLabel(L(v1::LINK_PIX)), "PIX");
  EXPECT_EQ(LinkLabel(L(v1::LINK_PXB)), "PXB");
  EXPECT_EQ(LinkLabel(L(v1::LINK_PHB)), "PHB");
  EXPECT_EQ(LinkLabel(L(v1::LINK_NODE)), "NODE");
  EXPECT_EQ(LinkLabel(L(v1::LINK_SYS)), "SYS");
  EXPECT_EQ(LinkLabel(L(v1::LINK_LOST)), "LOST");
  EXPECT_EQ(LinkLabel(L(v1::LINK_TYPE_UNSPECIFIED)), "?");
}

TEST(RenderTopologyTextTest, PrintsMatrixLikeNvidiaSmi) {
  v1::Topology t;
  t.set_hostname("node1");
  for (int i = 0; i < 2; ++i) {
    v1::Gpu* gpu = t.add_gpus();
    gpu->set_index(i);
    gpu->set_numa_node(i);
    gpu->set_cpu_affinity(i == 0 ? "0-15" : "16-31");
  }
  t.add_nics()->set_name("mlx5_0");
  AddRow(t.mutable_gpu_links(), {L(v1::LINK_SELF), L(v1::LINK_NVLINK, 18)});
  AddRow(t.mutable_gpu_links(), {L(v1::LINK_NVLINK, 18), L(v1::LINK_SELF)});
  AddRow(t.mutable_gpu_nic_links(), {L(v1::LINK_PIX)});
  AddRow(t.mutable_gpu_nic_links(), {L(v1::LINK_SYS)});
  AddRow(t.mutable_nic_links(), {L(v1::LINK_SELF)});
  t.set_classification(v1::FULLY_CONNECTED);
  t.set_nvswitches(4);
  t.set_nvml_status("ok");
  t.set_driver_version("550.54.15");
  t.add_warnings("GPU 1: nvmlDeviceGetName: Unknown Error (NVML 999)");

  std::string text = RenderTopologyText(t);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ASSERT_GE(lines.size(), 5u) << text;
  EXPECT_EQ(lines[0], "      GPU0  GPU1  NIC0  CPU Affinity  NUMA Affinity");
  EXPECT_EQ(lines[1], "GPU0   X    NV18  PIX   0-15          0");
  EXPECT_EQ(lines[2], "GPU1  NV18   X    SYS   16-31         1");
  EXPECT_EQ(lines[3], "NIC0  PIX   SYS    X");
  EXPECT_NE(text.find("\nLegend:\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  NV#  = Connection traversing a bonded set of # NVLinks"),
            std::string::npos);
  EXPECT_NE(text.find("\nNIC Legend:\n\n  NIC0: mlx5_0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Topology: FULLY_CONNECTED (4 NVSwitches)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("NVML: ok (driver 550.54.15)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Warning: GPU 1: nvmlDeviceGetName: Unknown Error (NVML 999)\n"),
            std::string::npos)
      << text;
}

TEST(RenderTopologyTextTest, NoDevicesAndMissingCellsStillRender) {
  v1::Topology t;
  t.set_nvml_status("no NVIDIA driver: dlopen: libnvidia-ml.so.1: cannot open shared object");
  std::string text = RenderTopologyText(t);
  EXPECT_NE(text.find("No GPUs or NICs found.\n"), std::string::npos) << text;
  EXPECT_NE(text.find("NVML: no NVIDIA driver: dlopen"), std::string::npos) << text;

  t.add_gpus()->set_numa_node(-1);  // a GPU with no link rows at all
  text = RenderTopologyText(t);
  EXPECT_NE(text.find("GPU0  ?     N/A           N/A\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace commd::topology
