// The watchdog's cursor over one rank's flight-recorder ring: what it last read of the rank
// (kept when a read fails), the recent entries by collective seq for the classifier, and which
// records it has already counted, so each completed collective's duration is observed once.
//
//   RankCursor cursor;
//   metrics.ObserveDurations(job, group, cursor.Read(member, now_ns));
//
// Reads are bounded seqlocked copies of shared memory (ring_reader.h). Not thread-safe.
#ifndef COMMD_DAEMON_WATCHDOG_RING_CURSOR_H_
#define COMMD_DAEMON_WATCHDOG_RING_CURSOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "daemon/groups/group_snapshot.h"
#include "daemon/recorder/ring_reader.h"
#include "daemon/watchdog/classifier.h"
#include "daemon/watchdog/group_metrics.h"

namespace commd::watchdog {

class RankCursor {
 public:
  // Reads `m`'s control block at `now_ns` (stamping discoveries), updates the view and the
  // entries; returns the durations of the collectives seen completed for the first time.
  std::vector<GroupMetrics::Duration> Read(const groups::MemberSnapshot& m, uint64_t now_ns);

  RankView last;                          // the last good read (kept when a read fails)
  std::map<uint64_t, EntryView> entries;  // recent entries by collective seq
  uint64_t progress_ns = 0;               // when the completed seq last changed
  uint32_t abort_reason = 0;

 private:
  std::vector<GroupMetrics::Duration> Observe(const RingSnapshot& snap);

  uint64_t next_record_ = 0;    // lowest record id not yet seen completed or retired
  std::set<uint64_t> counted_;  // completed records >= next_record_ already counted
  uint64_t completed_seen_ = 0;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_RING_CURSOR_H_
