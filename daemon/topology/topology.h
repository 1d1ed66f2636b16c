// Node topology discovery: CPUs, NUMA nodes and the PCI tree (hwloc), GPUs and NVLinks (NVML,
// loaded with dlopen), NICs (sysfs), the GPU×GPU / GPU×NIC link matrix in `nvidia-smi topo
// -m` terms, and the node's classification. The daemon runs it once at start-up and serves
// the result from GetTopology.
//
//   v1::Topology topology = commd::topology::DiscoverTopology(config.topology());
//   std::cout << commd::topology::RenderTopologyText(topology);
#ifndef COMMD_DAEMON_TOPOLOGY_TOPOLOGY_H_
#define COMMD_DAEMON_TOPOLOGY_TOPOLOGY_H_

#include <string>

#include "commd/v1/config.pb.h"
#include "commd/v1/topology.pb.h"
#include "format/topology_text.h"

namespace commd::topology {

// NVML library used when neither COMMD_NVML_LIBRARY nor topology.nvml_library names one.
inline constexpr char kDefaultNvmlLibrary[] = "libnvidia-ml.so.1";

// COMMD_NVML_LIBRARY when set and not empty, else config.nvml_library when not empty, else
// kDefaultNvmlLibrary.
std::string NvmlLibraryPath(const v1::TopologyConfig& config);

// Never fails: what cannot be found is left out, said in `warnings` (and logged as WARNING
// under "topology"), or, for NVML as a whole, in `nvml_status` ("ok", "no NVIDIA driver:
// <reason>" when the library or driver is absent, "NVML failed: <reason>" otherwise).
// config.hwloc_xml non-empty reads the machine from that file; config.sysfs_root (default
// "/sys") is where NICs are looked for. Blocks for hwloc, sysfs and NVML (well under a second
// on an 8-GPU node); thread-safe, though NVML serializes concurrent callers.
v1::Topology DiscoverTopology(const v1::TopologyConfig& config);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_TOPOLOGY_H_
