#include "daemon/topology/hwloc_probe.h"

#include <hwloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "daemon/topology/pci_address.h"

namespace commd::topology {
namespace {

// hwloc bitmaps print as "0-15,32-47" with the list form, the same as Linux cpulist files.
std::string ListString(hwloc_const_bitmap_t set) {
  if (set == nullptr || hwloc_bitmap_iszero(set)) return "";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string out(text);
  free(text);
  return out;
}

std::string Hostname(hwloc_topology_t topology) {
  const char* name = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topology), "HostName");
  if (name != nullptr && *name != '\0') return name;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

unsigned Count(hwloc_topology_t topology, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(topology, type);
  return n < 0 ? 0 : static_cast<unsigned>(n);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HwlocProbe>> HwlocProbe::Load(const std::string& xml_path) {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) {
    return absl::InternalError("hwloc_topology_init failed");
  }
  auto fail = [&](absl::string_view what) {
    int err = errno;
    hwloc_topology_destroy(topology);
    return absl::UnavailableError(absl::StrCat(what, ": ", strerror(err)));
  };
  if (!xml_path.empty() && hwloc_topology_set_xml(topology, xml_path.c_str()) != 0) {
    return fail(absl::StrCat("hwloc cannot read XML topology ", xml_path));
  }
  // Bridges are what PIX/PXB/PHB are made of; hwloc drops them unless told to keep them.
  hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_load(topology) != 0) {
    return fail(xml_path.empty() ? std::string("hwloc cannot load the machine topology")
                                 : absl::StrCat("hwloc cannot load XML topology ", xml_path));
  }
  return std::unique_ptr<HwlocProbe>(new HwlocProbe(topology));
}

HwlocProbe::~HwlocProbe() { hwloc_topology_destroy(topology_); }

void HwlocProbe::FillMachine(v1::Topology* t) const {
  t->set_hostname(Hostname(topology_));
  t->set_packages(Count(topology_, HWLOC_OBJ_PACKAGE));
  t->set_cores(Count(topology_, HWLOC_OBJ_CORE));
  t->set_pus(Count(topology_, HWLOC_OBJ_PU));
  t->set_pci_devices(Count(topology_, HWLOC_OBJ_PCI_DEVICE));
  t->clear_numa_nodes();
  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology_, HWLOC_OBJ_NUMANODE, nullptr);
       node != nullptr; node = hwloc_get_next_obj_by_type(topology_, HWLOC_OBJ_NUMANODE, node)) {
    v1::NumaNode* out = t->add_numa_nodes();
    out->set_os_index(node->os_index);
    out->set_cpus(ListString(node->cpuset));
    out->set_memory_bytes(node->attr->numanode.local_memory);
  }
}

PciLocation HwlocProbe::Locate(absl::string_view bus_id) const {
  PciLocation location;
  std::optional<PciAddress> address = ParsePciBusId(bus_id);
  if (!address) return location;
  hwloc_obj_t device = hwloc_get_pcidev_by_busid(topology_, address->domain, address->bus,
                                                 address->device, address->function);
  if (device == nullptr) return location;
  location.found = true;
  hwloc_obj_t parent = device->parent;
  for (; parent != nullptr && parent->type == HWLOC_OBJ_BRIDGE; parent = parent->parent) {
    bool host = parent->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
    location.bridges.push_back(
        {host ? PciHop::Kind::kHostBridge : PciHop::Kind::kPciBridge, parent->gp_index});
  }
  // The first non-I/O ancestor is what the device is local to.
  hwloc_obj_t cpu_side = hwloc_get_non_io_ancestor_obj(topology_, device);
  if (cpu_side != nullptr) {
    location.cpus = ListString(cpu_side->cpuset);
    if (cpu_side->nodeset != nullptr && hwloc_bitmap_weight(cpu_side->nodeset) == 1) {
      location.numa_node = hwloc_bitmap_first(cpu_side->nodeset);
    }
  }
  return location;
}

}  // namespace commd::topology
