// Text form of a node's topology, as `nvidia-smi topo -m` prints it, for `commctl topo` and
// logs. Depends only on the proto and Abseil (library commd_topology_text), so the CLI links
// it without hwloc.
//
//   v1::Topology t = ...;  // from the daemon's GetTopology RPC
//   std::cout << RenderTopologyText(t);
#ifndef COMMD_FORMAT_TOPOLOGY_TEXT_H_
#define COMMD_FORMAT_TOPOLOGY_TEXT_H_

#include <string>

#include "commd/v1/topology.pb.h"

namespace commd::topology {

// "X", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "LOST"; "?" for an unspecified type. Pure.
std::string LinkLabel(const v1::Link& link);

// The matrix (GPU rows, then NIC rows; GPU then NIC columns; CPU and NUMA affinity per GPU),
// a line per lost GPU, the legend, the NIC legend, then the classification, NVML status and
// warnings, each line ending in '\n'. Pure; never fails (missing rows or cells print as "?").
std::string RenderTopologyText(const v1::Topology& topology);

}  // namespace commd::topology

#endif  // COMMD_FORMAT_TOPOLOGY_TEXT_H_
