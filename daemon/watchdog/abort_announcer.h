// An abort across nodes (docs/cluster.md, "An abort across nodes"): when a formed group that
// spans nodes is aborted on this node for a reason of its own (an operator, a finding under
// NOTIFY or TERMINATE, a rank's death), the watchdog announces it, and every other node of the
// group aborts its ranks of the same formation. The cluster implements it
// (daemon/cluster/span_aborts.h); without a cluster there is none.
//
//   watchdog_options.aborts = &span_aborts;   // the watchdog announces
//   span_aborts.Watch([&](const SpanAbortNotice& a) { watchdog.OnRemoteAbort(a); });
#ifndef COMMD_DAEMON_WATCHDOG_ABORT_ANNOUNCER_H_
#define COMMD_DAEMON_WATCHDOG_ABORT_ANNOUNCER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/control_block.h"

namespace commd::watchdog {

// One abort of one formation of a spanning group, as announced and as received.
struct SpanAbortNotice {
  uid_t uid = 0;
  std::string job_id;
  std::string group;
  uint64_t formation = 0;  // GroupLayout.formation
  AbortReason reason = AbortReason::kAdmin;
  std::string text;  // what the announcing node's ranks were told
  std::string node;  // the announcing node (filled by the announcer)
};

class AbortAnnouncer {
 public:
  virtual ~AbortAnnouncer() = default;
  // Tells the group's other nodes. Never blocks (the watchdog's threads call it); a failure
  // (the cluster is disconnected) is logged and counted, and the local abort stands.
  virtual void Announce(SpanAbortNotice notice) = 0;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_ABORT_ANNOUNCER_H_
