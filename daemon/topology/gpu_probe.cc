#include "daemon/topology/gpu_probe.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/topology/pci_address.h"

namespace commd::topology {
namespace {

// Link queries fail per link; one warning per GPU and call says enough.
class GpuWarnings {
 public:
  GpuWarnings(unsigned index, std::vector<std::string>* out) : index_(index), out_(out) {}
  void Add(absl::string_view text) { out_->push_back(absl::StrCat("GPU ", index_, ": ", text)); }
  void Add(const absl::Status& status) { Add(status.message()); }
  void AddForLink(unsigned link, const absl::Status& status) {
    std::string call(status.message().substr(0, status.message().find(':')));
    if (!reported_.insert(call).second) return;
    out_->push_back(absl::StrCat("GPU ", index_, " link ", link, ": ", status.message(),
                                 " (later failures of this call on this GPU not listed)"));
  }

 private:
  unsigned index_;
  std::vector<std::string>* out_;
  std::set<std::string> reported_;
};

std::string BusIdOf(const nvmlPciInfo_t& pci) {
  return NormalizePciBusId(std::string(pci.busId, strnlen(pci.busId, sizeof(pci.busId))));
}

// Follows one active link to its far end: a GPU (counted as a direct peer) or an NVSwitch.
void ProbeRemote(NvmlApi& nvml, nvmlDevice_t device, unsigned link, GpuNvLinks* links,
                 std::set<std::string>* switches, GpuWarnings* warnings) {
  absl::StatusOr<nvmlIntNvLinkDeviceType_t> type = nvml.NvLinkRemoteDeviceType(device, link);
  if (!type.ok()) return warnings->AddForLink(link, type.status());
  if (*type == NVML_NVLINK_DEVICE_TYPE_SWITCH) ++links->switch_links;
  if (*type != NVML_NVLINK_DEVICE_TYPE_SWITCH && *type != NVML_NVLINK_DEVICE_TYPE_GPU) return;
  absl::StatusOr<nvmlPciInfo_t> remote = nvml.NvLinkRemotePciInfo(device, link);
  if (!remote.ok()) return warnings->AddForLink(link, remote.status());
  if (*type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
    switches->insert(BusIdOf(*remote));
  } else {
    ++links->peers[BusIdOf(*remote)];
  }
}

// Returns the number of active links.
unsigned ProbeNvLinks(NvmlApi& nvml, nvmlDevice_t device, GpuNvLinks* links,
                      std::set<std::string>* switches, GpuWarnings* warnings) {
  unsigned active = 0;
  for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
    absl::StatusOr<bool> up = nvml.NvLinkActive(device, link);
    if (!up.ok()) {
      // Past the last link, or a GPU without NVLink: the normal end of the scan.
      if (absl::IsInvalidArgument(up.status()) || absl::IsUnimplemented(up.status())) break;
      warnings->AddForLink(link, up.status());
      continue;
    }
    if (!*up) continue;
    ++active;
    ProbeRemote(nvml, device, link, links, switches, warnings);
  }
  return active;
}

// Failed identity queries of one GPU: each costs its field and a warning, except that
// NVML_ERROR_GPU_IS_LOST marks the whole GPU lost, said once.
class GpuFailures {
 public:
  explicit GpuFailures(GpuWarnings* warnings) : warnings_(warnings) {}
  void Add(const absl::Status& status) {
    if (NvmlReturnOf(status) != NVML_ERROR_GPU_IS_LOST) return warnings_->Add(status);
    if (lost_.ok()) lost_ = status;
  }
  bool lost() const { return !lost_.ok(); }
  // "lost (0000:1b:00.0): nvmlDeviceGetName: GPU is lost (NVML 15); ..."
  void ReportLost(const v1::Gpu& gpu) {
    warnings_->Add(absl::StrCat(
        "lost", gpu.pci_bus_id().empty() ? "" : absl::StrCat(" (", gpu.pci_bus_id(), ")"), ": ",
        lost_.message(),
        "; it fell off the bus or stopped answering (see dmesg for Xid 79), needs a reset or "
        "replacement, and no path to it works (LOST in the link matrix)"));
  }

 private:
  GpuWarnings* warnings_;
  absl::Status lost_;
};

void ProbeGpu(NvmlApi& nvml, unsigned index, GpuProbeResult* out, std::set<std::string>* switches) {
  GpuWarnings warnings(index, &out->warnings);
  GpuFailures failures(&warnings);
  v1::Gpu& gpu = out->gpus.emplace_back();
  GpuNvLinks& links = out->nvlinks.emplace_back();
  gpu.set_index(index);
  gpu.set_numa_node(-1);
  absl::StatusOr<nvmlDevice_t> device = nvml.DeviceHandleByIndex(index);
  if (device.ok()) {
    if (absl::StatusOr<std::string> name = nvml.DeviceName(*device); name.ok()) {
      gpu.set_name(*name);
    } else {
      failures.Add(name.status());
    }
    if (absl::StatusOr<std::string> uuid = nvml.DeviceUuid(*device); uuid.ok()) {
      gpu.set_uuid(*uuid);
    } else {
      failures.Add(uuid.status());
    }
    if (absl::StatusOr<nvmlPciInfo_t> pci = nvml.DevicePciInfo(*device); pci.ok()) {
      gpu.set_pci_bus_id(BusIdOf(*pci));
      links.pci_bus_id = gpu.pci_bus_id();
    } else {
      failures.Add(pci.status());
    }
  } else {
    failures.Add(device.status());
  }
  if (failures.lost()) {
    gpu.set_lost(true);
    links.lost = true;
    return failures.ReportLost(gpu);  // its links would answer "lost" too
  }
  if (device.ok()) gpu.set_nvlinks_active(ProbeNvLinks(nvml, *device, &links, switches, &warnings));
}

}  // namespace

absl::Status ProbeGpus(NvmlApi& nvml, GpuProbeResult* out) {
  RETURN_IF_ERROR(nvml.Init());
  absl::StatusOr<unsigned> count = nvml.DeviceCount();
  if (count.ok()) {
    if (absl::StatusOr<std::string> version = nvml.SystemDriverVersion(); version.ok()) {
      out->driver_version = *version;
    } else {
      out->warnings.push_back(std::string(version.status().message()));
    }
    std::set<std::string> switches;
    for (unsigned i = 0; i < *count; ++i) ProbeGpu(nvml, i, out, &switches);
    switches.erase("");  // unparsable bus ids cannot tell switches apart
    out->nvswitches = switches.size();
  }
  if (absl::Status s = nvml.Shutdown(); !s.ok()) out->warnings.push_back(std::string(s.message()));
  return count.status();
}

}  // namespace commd::topology
