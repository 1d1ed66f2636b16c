// Network adapters of a node, from sysfs: InfiniBand (and RoCE) devices under
// <sysfs_root>/class/infiniband and physical interfaces under <sysfs_root>/class/net. Tests
// point sysfs_root at a tree they build.
//
//   std::vector<std::string> warnings;
//   std::vector<v1::Nic> nics = ProbeNics("/sys", &warnings);
#ifndef COMMD_DAEMON_TOPOLOGY_NIC_PROBE_H_
#define COMMD_DAEMON_TOPOLOGY_NIC_PROBE_H_

#include <string>
#include <vector>

#include "commd/v1/topology.pb.h"

namespace commd::topology {

// InfiniBand devices first, then net interfaces, each sorted by name. An InfiniBand device
// reports its first port's state ("ACTIVE") and rate, and its net interface (IPoIB or RoCE)
// in `netdev`; that interface is not listed again. Net interfaces without a `device` link
// (lo, bridges, veth) are virtual and skipped. numa_node is sysfs's, -1 when it has none.
// Missing class directories mean no NICs; unreadable entries add to `warnings`. Reads files
// only; blocks briefly; thread-safe.
std::vector<v1::Nic> ProbeNics(const std::string& sysfs_root, std::vector<std::string>* warnings);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_NIC_PROBE_H_
