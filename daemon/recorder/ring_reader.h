// The daemon's reader of a rank's control block (common/control_block.h): a snapshot of the
// header, progress words, counters, abort word and flight-recorder ring (format/ring_snapshot.h).
//
//   ASSIGN_OR_RETURN(RingSnapshot snap, ReadControlBlock(base, mapped_bytes,
//                                                        {.expected_capacity = 2048}));
//   for (const RecordedEntry& e : snap.entries) ...;   // oldest first
//   if (snap.invalid_entries > 0) ...;                 // counted per InvalidReason
//
// The block is untrusted input: a buggy or hostile client can write any bytes into it, at
// any time, also while we read. Whatever it holds, reading never crashes, never reads
// outside [base, base + mapped_bytes), and ends after bounded work: a header that does not
// describe a block fitting the mapping is DATA_LOSS; an entry that fails validation or never
// settles is skipped and counted. Shared memory is copied only with 8-byte atomic loads.
// (The daemon must still seal the memfd against shrinking: no reader check can prevent the
// SIGBUS a truncated file causes.)
//
// Thread-safety: ReadControlBlock is thread-safe and never blocks the writer.
// StampDiscoveries writes the daemon-owned discovery slots and needs one caller per block at
// a time (the watchdog's poll).
#ifndef COMMD_DAEMON_RECORDER_RING_READER_H_
#define COMMD_DAEMON_RECORDER_RING_READER_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "common/control_block.h"
#include "format/ring_snapshot.h"

namespace commd {

struct RingReadOptions {
  uint32_t expected_capacity = 0;  // the capacity the daemon allocated; 0: trust the header's
  bool include_entries = true;     // false: header, progress, counters and abort only
  int max_tries = 64;              // per seqlocked record
  // Retries for the whole snapshot beyond the first try of each record; once spent, each
  // record gets a single try. Bounds the work a client flipping seq words can cause.
  uint32_t retry_budget = 4096;
  // Reads only the slots of records with id >= from_record_id (the newest ones, at most a
  // ring's worth), so a poller that remembers where it was reads new entries alone.
  std::optional<uint64_t> from_record_id;  // none: every slot
  // At most this many of those records, the newest (0: no limit). Bounds a poller's work
  // when a rank records faster than it polls.
  uint32_t max_entries = 0;
};

// Never blocks beyond the bounded retries; allocates the snapshot. INVALID_ARGUMENT for a
// null or not 8-byte aligned base; DATA_LOSS names the first header field that is wrong.
absl::StatusOr<RingSnapshot> ReadControlBlock(const void* base, size_t mapped_bytes,
                                              const RingReadOptions& options = {});

// Stamps `now_ns` into the discovery slot of every entry of `snapshot` that is started or
// completed and was not yet seen so, and fills the snapshot's time_discovered_* to match.
// Writes only daemon-owned slots, only within the mapping.
absl::Status StampDiscoveries(void* base, size_t mapped_bytes, uint64_t now_ns,
                              RingSnapshot* snapshot);

}  // namespace commd

#endif  // COMMD_DAEMON_RECORDER_RING_READER_H_
