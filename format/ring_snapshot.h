// What a read of a rank's control block yields (daemon/recorder/ring_reader.h reads it): the
// header, progress words, counters, abort word and flight-recorder entries, validated and
// decoded. The data of a flight-recorder dump (dump_json.h encodes it), kept apart from the
// reader so that the dump format needs no daemon code.
//
//   for (const RecordedEntry& e : snapshot.entries) ...;   // oldest first
//   if (snapshot.invalid_entries > 0) ...;                 // counted per InvalidReason
//
// Thread-safety: plain values; InvalidReasonName is a pure function.
#ifndef COMMD_FORMAT_RING_SNAPSHOT_H_
#define COMMD_FORMAT_RING_SNAPSHOT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/control_block.h"

namespace commd {

enum class InvalidReason : uint8_t {
  kUnsettled = 0,  // seq counter still odd or changing after the retries
  kRecordId,       // record id not in its slot, or far beyond the ring's next id
  kState,          // state not scheduled/started/completed
  kOp,             // op out of range
  kFlags,          // unknown flag bits, or p2p flag disagreeing with the op
  kTensorCount,    // more tensors recorded than the ABI allows / than the total
  kDims,           // dims count beyond the limit, or a negative size
  kDtype,          // dtype out of range
  kName,           // process group name or desc without a NUL
  kPeer,           // send/recv peer outside the group
};
inline constexpr size_t kInvalidReasonCount = 10;
const char* InvalidReasonName(InvalidReason reason);

struct RecordedEntry {
  uint64_t record_id = 0;
  uint64_t pg_id = 0;
  std::string pg_name;  // valid UTF-8 (invalid bytes become '?')
  std::string pg_desc;
  uint64_t collective_seq_id = 0;
  uint64_t p2p_seq_id = 0;
  uint64_t op_id = 0;
  CollectiveOp op = CollectiveOp::kAllReduce;
  int32_t peer = -1;  // send/recv peer, group rank
  std::vector<std::vector<int64_t>> input_sizes;
  std::vector<std::vector<int64_t>> output_sizes;
  std::vector<DataType> input_dtypes;
  std::vector<DataType> output_dtypes;
  uint32_t total_inputs = 0;  // as given to the writer; > input_sizes.size() when truncated
  uint32_t total_outputs = 0;
  bool truncated = false;
  RecordState state = RecordState::kScheduled;
  uint64_t time_created_ns = 0;
  uint64_t time_started_ns = 0;                        // rank clock, 0 when not started
  uint64_t time_completed_ns = 0;                      // rank clock, 0 when not completed
  std::optional<uint64_t> time_discovered_started_ns;  // daemon clock, when it first saw it
  std::optional<uint64_t> time_discovered_completed_ns;
  bool retired = false;
  bool is_p2p = false;
  bool nan_found = false;
  uint64_t timeout_ms = 0;
  uint64_t bytes = 0;
  std::optional<double> duration_ms;  // completed - started on the rank clock
};

struct RingSnapshot {
  uint32_t abi_version = 0;
  uint32_t ring_capacity = 0;
  uint64_t total_bytes = 0;
  int32_t rank = 0;
  int32_t world_size = 0;
  int32_t global_rank = 0;
  uint64_t created_ns = 0;

  uint64_t last_enqueued_seq = 0;
  uint64_t last_started_seq = 0;
  uint64_t last_completed_seq = 0;
  uint64_t heartbeat_ns = 0;

  uint64_t collectives = 0;
  uint64_t bytes = 0;
  uint64_t nan_checks = 0;
  uint64_t nans_found = 0;
  uint64_t abandoned = 0;
  std::array<uint64_t, kRecordOpCount> per_op{};

  uint32_t abort_reason = 0;  // AbortReason value as found (may be out of range)
  uint64_t abort_time_ns = 0;
  std::string abort_text;

  uint64_t next_record_id = 0;  // as read before the ring (its last scan, see below)
  uint64_t dropped = 0;         // as the writer counted it
  // Ascending record_id, all below next_record_id: records begun while the ring was read are
  // left for the next read, so every entry but the newest had finished when it began. The
  // ring is read newest first, so a rank recording faster than the read costs the snapshot
  // its oldest entries, never its newest; a writer that laps the whole ring before the
  // newest slot is read gets a fresh scan from its new head (twice at most).
  std::vector<RecordedEntry> entries;
  uint64_t invalid_entries = 0;
  std::array<uint64_t, kInvalidReasonCount> invalid_by_reason{};
};

}  // namespace commd

#endif  // COMMD_FORMAT_RING_SNAPSHOT_H_
