#include "daemon/topology/link_matrix.h"

#include <algorithm>

#include "format/topology_text.h"

namespace commd::topology {
namespace {

unsigned DirectLinks(const GpuNvLinks& from, const GpuNvLinks& to) {
  auto it = from.peers.find(to.pci_bus_id);
  return it == from.peers.end() ? 0 : it->second;
}

v1::Link GpuPairLink(const GpuNvLinks& na, const PciLocation& la, const GpuNvLinks& nb,
                     const PciLocation& lb) {
  // A lost GPU's PCI place is where it was, not a path that works: never draw one.
  if (na.lost || nb.lost) return MakeLink(v1::LINK_LOST);
  unsigned nvlinks = NvLinkCount(na, nb);
  if (nvlinks > 0) return MakeLink(v1::LINK_NVLINK, nvlinks);
  return MakeLink(PciLinkType(la, lb));
}

}  // namespace

v1::Link MakeLink(v1::LinkType type, unsigned nvlinks) {
  v1::Link link;
  link.set_type(type);
  if (type == v1::LINK_NVLINK) link.set_nvlinks(nvlinks);
  link.set_label(LinkLabel(link));
  return link;
}

v1::LinkType PciLinkType(const PciLocation& a, const PciLocation& b) {
  if (!a.found || !b.found) return v1::LINK_SYS;
  for (size_t i = 0; i < a.bridges.size(); ++i) {
    for (size_t j = 0; j < b.bridges.size(); ++j) {
      if (a.bridges[i].id != b.bridges[j].id) continue;
      if (a.bridges[i].kind == PciHop::Kind::kHostBridge) return v1::LINK_PHB;
      return (i <= 1 && j <= 1) ? v1::LINK_PIX : v1::LINK_PXB;
    }
  }
  if (a.numa_node >= 0 && a.numa_node == b.numa_node) return v1::LINK_NODE;
  return v1::LINK_SYS;
}

unsigned NvLinkCount(const GpuNvLinks& a, const GpuNvLinks& b) {
  unsigned direct = std::max(DirectLinks(a, b), DirectLinks(b, a));
  return direct + std::min(a.switch_links, b.switch_links);
}

void FillLinkMatrices(const std::vector<GpuNvLinks>& nvlinks,
                      const std::vector<PciLocation>& gpu_locations,
                      const std::vector<PciLocation>& nic_locations, v1::Topology* topology) {
  topology->clear_gpu_links();
  topology->clear_gpu_nic_links();
  topology->clear_nic_links();
  for (size_t i = 0; i < gpu_locations.size(); ++i) {
    v1::LinkRow* row = topology->add_gpu_links();
    for (size_t j = 0; j < gpu_locations.size(); ++j) {
      *row->add_links() =
          i == j ? MakeLink(v1::LINK_SELF)
                 : GpuPairLink(nvlinks[i], gpu_locations[i], nvlinks[j], gpu_locations[j]);
    }
    v1::LinkRow* nic_row = topology->add_gpu_nic_links();
    for (const PciLocation& nic : nic_locations) {
      *nic_row->add_links() =
          MakeLink(nvlinks[i].lost ? v1::LINK_LOST : PciLinkType(gpu_locations[i], nic));
    }
  }
  for (size_t k = 0; k < nic_locations.size(); ++k) {
    v1::LinkRow* row = topology->add_nic_links();
    for (size_t l = 0; l < nic_locations.size(); ++l) {
      *row->add_links() =
          MakeLink(k == l ? v1::LINK_SELF : PciLinkType(nic_locations[k], nic_locations[l]));
    }
  }
}

v1::TopologyClass Classify(const v1::Topology& topology) {
  const int n = topology.gpu_links_size();
  if (n < 2) return v1::NONE;
  int nvlink_pairs = 0;
  bool four_neighbours_each = true;
  for (int i = 0; i < n; ++i) {
    int neighbours = 0;
    for (const v1::Link& link : topology.gpu_links(i).links()) {
      if (link.type() == v1::LINK_NVLINK) ++neighbours;
    }
    nvlink_pairs += neighbours;
    if (neighbours != 4) four_neighbours_each = false;
  }
  nvlink_pairs /= 2;  // each pair was counted from both ends
  if (nvlink_pairs == 0) return v1::NONE;
  if (nvlink_pairs == n * (n - 1) / 2) return v1::FULLY_CONNECTED;
  if (n == 8 && four_neighbours_each) return v1::HYBRID_CUBE_MESH;
  return v1::PARTIAL;
}

}  // namespace commd::topology
