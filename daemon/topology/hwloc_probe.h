// CPUs, NUMA nodes and the PCI tree of a node, from hwloc: either the live machine or an
// hwloc XML export (`lstopo --of xml`), which is how tests describe machines they do not run
// on.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<HwlocProbe> probe, HwlocProbe::Load(""));
//   probe->FillMachine(&topology);
//   PciLocation gpu0 = probe->Locate("0000:1b:00.0");
#ifndef COMMD_DAEMON_TOPOLOGY_HWLOC_PROBE_H_
#define COMMD_DAEMON_TOPOLOGY_HWLOC_PROBE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "commd/v1/topology.pb.h"
#include "daemon/topology/link_matrix.h"

struct hwloc_topology;

namespace commd::topology {

// An loaded hwloc topology with every PCI bridge and device kept (hwloc drops them by
// default). Immutable after Load, so const methods may be called from any thread.
class HwlocProbe {
 public:
  // Loads `xml_path`, or the live machine when it is empty. Blocks while hwloc reads sysfs
  // (tens of milliseconds on large nodes). Fails when hwloc cannot read the XML.
  static absl::StatusOr<std::unique_ptr<HwlocProbe>> Load(const std::string& xml_path);
  ~HwlocProbe();
  HwlocProbe(const HwlocProbe&) = delete;
  HwlocProbe& operator=(const HwlocProbe&) = delete;

  // Sets hostname (the XML's HostName, else gethostname), packages, cores, pus, numa_nodes
  // and pci_devices.
  void FillMachine(v1::Topology* topology) const;

  // Where the PCI device `bus_id` (any spelling ParsePciBusId accepts) sits; found=false
  // when the tree has no such device.
  PciLocation Locate(absl::string_view bus_id) const;

 private:
  explicit HwlocProbe(hwloc_topology* topology) : topology_(topology) {}
  hwloc_topology* topology_;
};

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_HWLOC_PROBE_H_
