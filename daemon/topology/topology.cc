#include "daemon/topology/topology.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/topology/gpu_probe.h"
#include "daemon/topology/hwloc_probe.h"
#include "daemon/topology/link_matrix.h"
#include "daemon/topology/nic_probe.h"
#include "daemon/topology/nvml_api.h"

namespace commd::topology {
namespace {

// Fills gpus, driver_version, nvswitches and nvml_status; returns the NVLink facts.
std::vector<GpuNvLinks> DiscoverGpus(const v1::TopologyConfig& config, v1::Topology* t,
                                     std::vector<std::string>* warnings) {
  const std::string path = NvmlLibraryPath(config);
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvml(path);
  if (!nvml.ok()) {
    // The normal case on CPU-only nodes, hence not a warning.
    t->set_nvml_status(absl::StrCat("no NVIDIA driver: ", nvml.status().message()));
    COMMD_LOG(INFO, "topology") << t->nvml_status();
    return {};
  }
  GpuProbeResult result;
  absl::Status status = ProbeGpus(**nvml, &result);
  warnings->insert(warnings->end(), result.warnings.begin(), result.warnings.end());
  if (absl::IsFailedPrecondition(status)) {
    t->set_nvml_status(absl::StrCat("no NVIDIA driver: ", status.message()));
    COMMD_LOG(INFO, "topology") << t->nvml_status() << " (library " << path << ")";
  } else if (!status.ok()) {
    t->set_nvml_status(absl::StrCat("NVML failed: ", status.message()));
    warnings->push_back(t->nvml_status());
  } else {
    t->set_nvml_status("ok");
  }
  t->set_driver_version(result.driver_version);
  t->set_nvswitches(result.nvswitches);
  for (v1::Gpu& gpu : result.gpus) *t->add_gpus() = std::move(gpu);
  return std::move(result.nvlinks);
}

// Sets each GPU's NUMA node and CPU list from where it sits; returns the locations.
std::vector<PciLocation> LocateGpus(const HwlocProbe* hwloc, v1::Topology* t,
                                    std::vector<std::string>* warnings) {
  std::vector<PciLocation> locations;
  for (v1::Gpu& gpu : *t->mutable_gpus()) {
    PciLocation& location = locations.emplace_back();
    if (hwloc == nullptr || gpu.pci_bus_id().empty()) continue;
    location = hwloc->Locate(gpu.pci_bus_id());
    if (!location.found && !gpu.lost()) {
      warnings->push_back(absl::StrCat("GPU ", gpu.index(), " (", gpu.pci_bus_id(),
                                       ") is not in the PCI tree; its links count as SYS"));
    }
    gpu.set_numa_node(location.numa_node);
    gpu.set_cpu_affinity(location.cpus);
  }
  return locations;
}

std::vector<PciLocation> LocateNics(const HwlocProbe* hwloc, v1::Topology* t) {
  std::vector<PciLocation> locations;
  for (v1::Nic& nic : *t->mutable_nics()) {
    PciLocation& location = locations.emplace_back();
    if (hwloc == nullptr || nic.pci_bus_id().empty()) continue;
    location = hwloc->Locate(nic.pci_bus_id());
    if (nic.numa_node() < 0) nic.set_numa_node(location.numa_node);
  }
  return locations;
}

}  // namespace

std::string NvmlLibraryPath(const v1::TopologyConfig& config) {
  const char* env = std::getenv("COMMD_NVML_LIBRARY");
  if (env != nullptr && *env != '\0') return env;
  if (!config.nvml_library().empty()) return config.nvml_library();
  return kDefaultNvmlLibrary;
}

v1::Topology DiscoverTopology(const v1::TopologyConfig& config) {
  v1::Topology t;
  std::vector<std::string> warnings;
  absl::StatusOr<std::unique_ptr<HwlocProbe>> hwloc = HwlocProbe::Load(config.hwloc_xml());
  if (hwloc.ok()) {
    (*hwloc)->FillMachine(&t);
  } else {
    warnings.push_back(std::string(hwloc.status().message()));
  }
  const HwlocProbe* probe = hwloc.ok() ? hwloc->get() : nullptr;
  const std::string sysfs_root = config.sysfs_root().empty() ? "/sys" : config.sysfs_root();
  for (v1::Nic& nic : ProbeNics(sysfs_root, &warnings)) *t.add_nics() = std::move(nic);
  std::vector<GpuNvLinks> nvlinks = DiscoverGpus(config, &t, &warnings);
  std::vector<PciLocation> gpu_locations = LocateGpus(probe, &t, &warnings);
  std::vector<PciLocation> nic_locations = LocateNics(probe, &t);
  FillLinkMatrices(nvlinks, gpu_locations, nic_locations, &t);
  t.set_classification(Classify(t));
  for (const std::string& warning : warnings) {
    COMMD_LOG(WARNING, "topology") << warning;
    t.add_warnings(warning);
  }
  return t;
}

}  // namespace commd::topology
