// Link classification in the vocabulary of `nvidia-smi topo -m`, as pure functions over plain
// structs: the probes (hwloc for PCI, NVML for NVLink) fill the structs, these functions
// decide X / NV# / PIX / PXB / PHB / NODE / SYS and the node's TopologyClass. Kept free of
// hwloc and NVML so every rule is unit-tested on hand-built trees.
//
//   std::vector<GpuNvLinks> nvlinks = ...;        // from NVML
//   std::vector<PciLocation> gpus = ..., nics = ...;  // from hwloc
//   FillLinkMatrices(nvlinks, gpus, nics, &topology);
//   topology.set_classification(Classify(topology));
#ifndef COMMD_DAEMON_TOPOLOGY_LINK_MATRIX_H_
#define COMMD_DAEMON_TOPOLOGY_LINK_MATRIX_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "commd/v1/topology.pb.h"

namespace commd::topology {

// One I/O object above a PCI device.
struct PciHop {
  enum class Kind { kPciBridge, kHostBridge };
  Kind kind = Kind::kPciBridge;
  uint64_t id = 0;  // unique within one topology (hwloc's gp_index)
};

// Where a PCI device sits in the machine.
struct PciLocation {
  bool found = false;           // false: the PCI tree does not know the device
  std::vector<PciHop> bridges;  // nearest first, up to and including the host bridge
  int numa_node = -1;           // NUMA node of the CPU side it hangs from; -1 if not one
  std::string cpus;             // CPU list of that CPU side, e.g. "0-15,32-47"
};

// What NVML says about one GPU's NVLinks.
struct GpuNvLinks {
  std::string pci_bus_id;                 // normalized, see pci_address.h
  std::map<std::string, unsigned> peers;  // remote GPU bus id -> active direct links
  unsigned switch_links = 0;              // active links to NVSwitches
  bool lost = false;                      // NVML reports the GPU lost: no path to it
};

// A Link with its label filled in (nvlinks only matters for LINK_NVLINK).
v1::Link MakeLink(v1::LinkType type, unsigned nvlinks = 0);

// PCIe path between two different devices:
//  PIX  nearest common ancestor is a PCI bridge and each device sits at most one bridge below
//       it (one switch: its upstream port and a downstream port count as one bridge, as
//       nvidia-smi counts them);
//  PXB  common PCI bridge further away;
//  PHB  common host bridge;
//  NODE no common bridge, both on the same NUMA node;
//  SYS  otherwise, including when either device is unknown to the PCI tree.
v1::LinkType PciLinkType(const PciLocation& a, const PciLocation& b);

// NVLinks between two GPUs: direct links (the larger of the two sides' counts, so a failed
// query on one side does not hide a link the other side saw) plus, when both have NVSwitch
// links, the smaller of their switch-link counts (traffic is bounded by the thinner side).
unsigned NvLinkCount(const GpuNvLinks& a, const GpuNvLinks& b);

// Fills gpu_links (X on the diagonal, LOST in a lost GPU's row and column, NV# where
// NvLinkCount > 0, else the PCIe type), gpu_nic_links (LOST in a lost GPU's row) and
// nic_links. `nvlinks` and `gpu_locations` are indexed like the GPUs.
void FillLinkMatrices(const std::vector<GpuNvLinks>& nvlinks,
                      const std::vector<PciLocation>& gpu_locations,
                      const std::vector<PciLocation>& nic_locations, v1::Topology* topology);

// From gpu_links: NONE with fewer than two GPUs or no NVLink pair; FULLY_CONNECTED when
// every pair has NVLink; HYBRID_CUBE_MESH with 8 GPUs of exactly 4 NVLink neighbours each;
// PARTIAL otherwise.
v1::TopologyClass Classify(const v1::Topology& topology);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_LINK_MATRIX_H_
