// GPUs and their NVLinks, from NVML through the NvmlApi seam. A failing call costs only the
// fields it would have filled: it becomes a warning and discovery goes on.
//
//   GpuProbeResult gpus;
//   absl::Status s = ProbeGpus(*nvml, &gpus);   // !ok: NVML itself is unusable
#ifndef COMMD_DAEMON_TOPOLOGY_GPU_PROBE_H_
#define COMMD_DAEMON_TOPOLOGY_GPU_PROBE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "commd/v1/topology.pb.h"
#include "daemon/topology/link_matrix.h"
#include "daemon/topology/nvml_api.h"

namespace commd::topology {

struct GpuProbeResult {
  // index, name, uuid, pci_bus_id and nvlinks_active set; NUMA and CPU fields are hwloc's.
  std::vector<v1::Gpu> gpus;
  std::vector<GpuNvLinks> nvlinks;  // indexed like gpus
  std::string driver_version;
  unsigned nvswitches = 0;  // distinct NVSwitches seen at the far end of GPU links
  // "GPU 3: nvmlDeviceGetName: Unknown Error (NVML 999)", one per failed call (per GPU and
  // call for link queries, which would otherwise repeat for every link).
  std::vector<std::string> warnings;
};

// Calls nvmlInit_v2, queries every device and calls nvmlShutdown. Returns the nvmlInit_v2 or
// nvmlDeviceGetCount_v2 error when NVML cannot list GPUs at all; everything else goes to
// `out->warnings`. Blocks for the NVML calls; not thread-safe with other users of `nvml`.
absl::Status ProbeGpus(NvmlApi& nvml, GpuProbeResult* out);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_GPU_PROBE_H_
