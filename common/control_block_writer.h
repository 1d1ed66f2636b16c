// The rank's side of the flight recorder: records each collective into the control block's
// ring and keeps the progress words, counters and heartbeat current.
//
//   ASSIGN_OR_RETURN(auto writer, RingWriter::Attach(base, mapped_bytes, {.pg_name = "0"}));
//   const int64_t dims[] = {1024};
//   TensorDesc t{.dims = dims, .ndim = 1, .dtype = DataType::kFloat32};
//   RecordHandle h = writer->Begin({.op = CollectiveOp::kAllReduce, .inputs = {&t, 1},
//                                   .outputs = {&t, 1}, .timeout_ms = 600000});
//   writer->Started(h);     // (BeginStarted does both when the collective starts at once)
//   ...
//   writer->Completed(h);   // or Abandon(h) when the collective failed or timed out
//
// Begin/Started/Completed take no lock, allocate nothing and make no system call: a few
// relaxed stores under the entry's seqlock plus one clock read each. An entry's group
// (pg id, name, description: 136 bytes) is written into a slot only when the slot does not
// hold that group's already from this writer's previous lap, and so are a prepared
// shape's fields (RecordShape: op, tensors, bytes, counts, peer, timeout). The ring keeps the
// newest `capacity` entries; each overwrite counts one `dropped`.
//
// Sequence ids follow PyTorch's recorder: a collective increments its group's
// collective_seq_id and records the current p2p_seq_id; send/recv do the opposite. op_id
// increments for every entry. Progress words follow collectives only (p2p ops involve a
// subset of the group, so they cannot be compared across ranks).
//
// Thread-safety: a RingWriter is the single writer of its block. It is not thread-safe; the
// SDK serializes calls per group. Readers (the daemon) never block it.
#ifndef COMMD_COMMON_CONTROL_BLOCK_WRITER_H_
#define COMMD_COMMON_CONTROL_BLOCK_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/control_block.h"
#include "common/control_block_atomic.h"
#include "common/control_block_clock.h"

namespace commd {

struct RecordArgs {
  CollectiveOp op = CollectiveOp::kAllReduce;
  uint32_t pg = 0;  // from RegisterProcessGroup; 0 is the writer's own group
  std::span<const TensorDesc> inputs;
  std::span<const TensorDesc> outputs;
  int32_t peer = -1;  // send / recv: the peer's rank in the group
  uint64_t timeout_ms = 0;
  // A member of a coalesced group after the first: reuse the last sequence id of its kind.
  bool same_seq_as_previous = false;
};

// An entry's shape: what RecordArgs gives (op, group, tensors, peer, timeout), for calls
// that repeat it. Made by RingWriter::Prepare and recorded by BeginPrepared /
// BeginStartedPrepared as often as wanted: a slot that already holds the same shape from this
// writer's previous lap keeps every field the shape determines (group names, op, tensors, bytes,
// counts, peer, timeout) and gets only the call's own (ids, sequence ids, times, state, flags). The
// spans in `args` (and the dims they point to) are borrowed for as long as the shape is used.
struct RecordShape {
  RecordArgs args;
  uint64_t id = 0;  // 0: not prepared (every record writes the entry in full)
  // Set by Prepare: the entry's bytes (all inputs) and its kRecordFlagP2p /
  // kRecordFlagTruncated flags.
  uint64_t bytes = 0;
  uint8_t flags = 0;
};

// Returned by Begin; pass it to the later calls. Cheap to copy.
struct RecordHandle {
  uint64_t record_id = ~uint64_t{0};
  uint64_t collective_seq_id = 0;  // 0 for p2p
  uint64_t bytes = 0;
  CollectiveOp op = CollectiveOp::kAllReduce;
};

struct RingWriterOptions {
  uint64_t pg_id = 0;
  std::string pg_name = "0";
  std::string pg_desc = "undefined";     // PyTorch's value when a group has no description
  std::unique_ptr<RecorderClock> clock;  // null: NewTscRecorderClock()
};

class RingWriter {
 public:
  static constexpr uint32_t kMaxProcessGroups = 16;

  // Checks the header the daemon wrote (magic, version, sizes against `mapped_bytes`) and
  // continues after the newest entry already in the ring. `base` must stay mapped for the
  // writer's lifetime. FAILED_PRECONDITION names the mismatch.
  static absl::StatusOr<std::unique_ptr<RingWriter>> Attach(void* base, size_t mapped_bytes,
                                                            RingWriterOptions options = {});

  // Adds a process group whose entries this writer also records (e.g. NCCL groups recorded
  // through Group::recorder()). Names longer than 63 bytes are cut at a UTF-8 boundary.
  // RESOURCE_EXHAUSTED beyond kMaxProcessGroups. Not for the hot path (no allocation though).
  absl::StatusOr<uint32_t> RegisterProcessGroup(uint64_t pg_id, std::string_view name,
                                                std::string_view desc);

  // `args` as a shape (see RecordShape): its id is new in this process, so no slot of any
  // writer holds it yet. Cheap (no allocation); make one when a call's shape is first seen,
  // not per call. Thread-safe.
  static RecordShape Prepare(const RecordArgs& args);

  // Records a new entry in state "scheduled". An unknown `pg` records under group 0. The
  // *Prepared forms take a shape: prepared, or with id 0 (the arguments written in full).
  RecordHandle Begin(const RecordArgs& args) { return Record({.args = args}, false); }
  RecordHandle BeginPrepared(const RecordShape& shape) { return Record(shape, false); }
  // Begin + Started with one clock read, for collectives that start when they are called
  // (the host backend): created and started times are equal.
  RecordHandle BeginStarted(const RecordArgs& args) { return Record({.args = args}, true); }
  RecordHandle BeginStartedPrepared(const RecordShape& shape) { return Record(shape, true); }
  // The collective_seq_id the next Begin* of `args` gets (0 for point-to-point), so that a
  // caller can decide what depends on it (the SDK's sampled NaN check) before recording.
  uint64_t NextCollectiveSeq(const RecordArgs& args) const {
    if (IsP2p(args.op)) return 0;
    const uint64_t seq = groups_[args.pg < num_groups_ ? args.pg : 0].collective_seq;
    return args.same_seq_as_previous && seq != 0 ? seq : seq + 1;
  }
  // Marks the entry started / completed (completed also retires it). Calls on an entry the
  // ring has since overwritten still update progress words and counters.
  void Started(const RecordHandle& h) { MarkStarted(h, /*write_progress=*/true); }
  void Completed(const RecordHandle& h) { MarkCompleted(h, /*write_progress=*/true); }
  // The same for stream-ordered recording, leaving last_started_seq / last_completed_seq to
  // a write the caller enqueued on its GPU stream (cuStreamWriteValue64): the entry, counters
  // and heartbeat get the CPU's time of the call.
  void StartedExceptProgress(const RecordHandle& h) { MarkStarted(h, false); }
  void CompletedExceptProgress(const RecordHandle& h) { MarkCompleted(h, false); }
  // Retires the entry without completing it (timed out, aborted, failed).
  void Abandon(const RecordHandle& h);
  // Whether `h` is an entry of this writer's ring that is begun and not retired (neither
  // completed nor abandoned) and still in the ring: what a part of a collective
  // (CollectiveOptions::part_of) may name. Reads only this writer's own words.
  bool Pending(const RecordHandle& h) const {
    if (h.record_id >= next_record_id_) return false;
    const RingEntry* e = Live(h.record_id);
    return e != nullptr && (cb_atomic::LoadRelaxed(&e->flags) & kRecordFlagRetired) == 0 &&
           cb_atomic::LoadRelaxed(&e->collective_seq_id) == h.collective_seq_id &&
           cb_atomic::LoadRelaxed(&e->op) == static_cast<uint16_t>(h.op);
  }
  // Counts a NaN/Inf check on the entry's data; a hit also flags the entry.
  void NanChecked(const RecordHandle& h, bool nan_found);
  // Updates the heartbeat alone, for long waits between collectives.
  void Heartbeat();

  // The daemon's abort request: kNone until set (acquire load, safe from any thread).
  AbortReason abort_reason() const;
  // The reason text; allocates, call only after abort_reason() != kNone.
  std::string abort_text() const;

  uint32_t capacity() const { return mask_ + 1; }
  uint64_t next_record_id() const { return next_record_id_; }

  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

 private:
  struct Group {
    uint64_t pg_id = 0;
    uint64_t name_words[kRecordNameBytes / 8] = {};
    uint64_t desc_words[kRecordNameBytes / 8] = {};
    uint64_t collective_seq = 0;
    uint64_t p2p_seq = 0;
    uint64_t op_id = 0;
  };

  RingWriter(char* base, std::unique_ptr<RecorderClock> clock);
  static bool IsP2p(CollectiveOp op) {
    return op == CollectiveOp::kSend || op == CollectiveOp::kRecv;
  }
  RecordHandle Record(const RecordShape& shape, bool started);
  void MarkStarted(const RecordHandle& h, bool write_progress);
  void MarkCompleted(const RecordHandle& h, bool write_progress);
  RingEntry* Slot(uint64_t record_id) const { return ring_ + (record_id & mask_); }
  // The entry if it still holds `record_id`, else nullptr (overwritten by the wrap).
  RingEntry* Live(uint64_t record_id) const {
    RingEntry* e = Slot(record_id);
    return cb_atomic::LoadRelaxed(&e->record_id) == record_id &&
                   cb_atomic::LoadRelaxed(&e->seq) != 0
               ? e
               : nullptr;
  }
  static void SetName(uint64_t* words, std::string_view text);
  // By slot: what this writer last wrote into it that a later entry may keep, since
  // nothing else writes entries and the slot's seqlock covers the entry as a whole:
  // 1 + the group whose pg id, name and description are there (0: none yet), and the
  // shape (RecordShape::id) whose fields are there (0: none, or one not prepared).
  struct SlotHolds {
    uint64_t shape = 0;
    uint8_t group = 0;
  };
  struct ShapeFacts {
    uint64_t bytes = 0;
    uint8_t flags = 0;  // kRecordFlagP2p, kRecordFlagTruncated
  };
  // Writes the fields `shape` determines into a slot that does not hold them (Record checks
  // first: out of line, so that a prepared shape's record pays nothing for it).
  [[gnu::noinline]] ShapeFacts WriteShape(RingEntry* e, const RecordShape& shape, uint32_t pg,
                                          SlotHolds& holds);
  static void Bump(uint64_t* counter, uint64_t by = 1) {
    // Single writer: a load and a store, no locked read-modify-write.
    cb_atomic::StoreRelaxed(counter, cb_atomic::LoadRelaxed(counter) + by);
  }

  ControlBlockProgress* progress_;
  ControlBlockRingState* ring_state_;
  ControlBlockCounters* counters_;
  const ControlBlockAbort* abort_;
  RingEntry* ring_;
  uint32_t mask_ = 0;
  uint64_t next_record_id_ = 0;
  uint64_t dropped_ = 0;
  uint32_t num_groups_ = 0;
  Group groups_[kMaxProcessGroups];
  std::unique_ptr<SlotHolds[]> slot_holds_;  // by slot
  std::unique_ptr<RecorderClock> clock_;
};

}  // namespace commd

#endif  // COMMD_COMMON_CONTROL_BLOCK_WRITER_H_
