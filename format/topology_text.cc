#include "format/topology_text.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace commd::topology {
namespace {

using Table = std::vector<std::vector<std::string>>;

constexpr const char* kLegend[] = {
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
    "Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
};

std::string Cell(const v1::LinkRow* row, int column) {
  if (row == nullptr || column >= row->links_size()) return "?";
  const v1::Link& link = row->links(column);
  return link.label().empty() ? LinkLabel(link) : link.label();
}

const v1::LinkRow* Row(const google::protobuf::RepeatedPtrField<v1::LinkRow>& rows, int i) {
  return i < rows.size() ? &rows.Get(i) : nullptr;
}

// Header, one row per GPU, one per NIC. NIC rows read GPU columns from the transposed
// gpu_nic_links, since the proto keeps each pair once.
Table BuildTable(const v1::Topology& t) {
  const int gpus = t.gpus_size();
  const int nics = t.nics_size();
  Table table;
  std::vector<std::string> header = {""};
  for (int i = 0; i < gpus; ++i) header.push_back(absl::StrCat("GPU", i));
  for (int k = 0; k < nics; ++k) header.push_back(absl::StrCat("NIC", k));
  if (gpus > 0) {
    header.push_back("CPU Affinity");
    header.push_back("NUMA Affinity");
  }
  table.push_back(header);
  for (int i = 0; i < gpus; ++i) {
    std::vector<std::string> row = {absl::StrCat("GPU", i)};
    for (int j = 0; j < gpus; ++j) row.push_back(Cell(Row(t.gpu_links(), i), j));
    for (int k = 0; k < nics; ++k) row.push_back(Cell(Row(t.gpu_nic_links(), i), k));
    const v1::Gpu& gpu = t.gpus(i);
    row.push_back(gpu.cpu_affinity().empty() ? "N/A" : gpu.cpu_affinity());
    row.push_back(gpu.numa_node() < 0 ? "N/A" : absl::StrCat(gpu.numa_node()));
    table.push_back(row);
  }
  for (int k = 0; k < nics; ++k) {
    std::vector<std::string> row = {absl::StrCat("NIC", k)};
    for (int i = 0; i < gpus; ++i) row.push_back(Cell(Row(t.gpu_nic_links(), i), k));
    for (int l = 0; l < nics; ++l) row.push_back(Cell(Row(t.nic_links(), k), l));
    table.push_back(row);
  }
  return table;
}

std::string FormatTable(Table table) {
  std::vector<size_t> widths;
  for (auto& row : table) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) {
      if (row[c] == "X") row[c] = " X";  // centred under its header, as nvidia-smi prints it
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c], std::string(widths[c] + 2 - row[c].size(), ' '));
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Summary(const v1::Topology& t) {
  std::string out = absl::StrCat(
      "Host ", t.hostname().empty() ? "?" : t.hostname(), ": ", t.packages(), " packages, ",
      t.cores(), " cores, ", t.pus(), " PUs, ", t.numa_nodes_size(), " NUMA nodes, ",
      t.pci_devices(), " PCI devices, ", t.gpus_size(), " GPUs, ", t.nics_size(), " NICs\n");
  absl::StrAppend(&out, "Topology: ", v1::TopologyClass_Name(t.classification()));
  if (t.nvswitches() > 0) absl::StrAppend(&out, " (", t.nvswitches(), " NVSwitches)");
  absl::StrAppend(&out, "\nNVML: ", t.nvml_status().empty() ? "?" : t.nvml_status());
  if (!t.driver_version().empty()) absl::StrAppend(&out, " (driver ", t.driver_version(), ")");
  absl::StrAppend(&out, "\n");
  for (const std::string& warning : t.warnings()) absl::StrAppend(&out, "Warning: ", warning, "\n");
  return out;
}

// One line per lost GPU, before everything else a reader might take for a working path.
std::string LostGpus(const v1::Topology& t) {
  std::string out;
  for (const v1::Gpu& gpu : t.gpus()) {
    if (!gpu.lost()) continue;
    absl::StrAppend(&out, "GPU", gpu.index(), " is LOST",
                    gpu.pci_bus_id().empty() ? "" : absl::StrCat(" (", gpu.pci_bus_id(), ")"),
                    ": NVML reports it lost (fallen off the bus or not answering); no path to it "
                    "works until it is reset or replaced\n");
  }
  return out;
}

}  // namespace

std::string LinkLabel(const v1::Link& link) {
  switch (link.type()) {
    case v1::LINK_SELF:
      return "X";
    case v1::LINK_NVLINK:
      return absl::StrCat("NV", link.nvlinks());
    case v1::LINK_PIX:
      return "PIX";
    case v1::LINK_PXB:
      return "PXB";
    case v1::LINK_PHB:
      return "PHB";
    case v1::LINK_NODE:
      return "NODE";
    case v1::LINK_SYS:
      return "SYS";
    case v1::LINK_LOST:
      return "LOST";
    default:
      return "?";
  }
}

std::string RenderTopologyText(const v1::Topology& t) {
  std::string out;
  if (t.gpus_size() + t.nics_size() > 0) {
    const std::string lost = LostGpus(t);
    absl::StrAppend(&out, FormatTable(BuildTable(t)), lost.empty() ? "" : "\n", lost,
                    "\nLegend:\n\n", absl::StrJoin(kLegend, "\n"), "\n");
    if (!lost.empty()) absl::StrAppend(&out, "  LOST = GPU that NVML reports lost: no path\n");
  } else {
    absl::StrAppend(&out, "No GPUs or NICs found.\n");
  }
  if (t.nics_size() > 0) {
    absl::StrAppend(&out, "\nNIC Legend:\n\n");
    for (int k = 0; k < t.nics_size(); ++k) {
      absl::StrAppend(&out, "  NIC", k, ": ", t.nics(k).name(), "\n");
    }
  }
  absl::StrAppend(&out, "\n", Summary(t));
  return out;
}

}  // namespace commd::topology
