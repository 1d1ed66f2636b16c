// The control block: the shared-memory ABI between one rank (client SDK) and the daemon.
//
// One block exists per (session, group, rank). The daemon allocates it in host shared memory
// (memfd), initializes it (control_block_admin.h) and hands the fd to the client, which maps
// it and records its collectives into the flight-recorder ring (control_block_writer.h). The
// daemon reads it without trusting a byte of it (daemon/recorder/ring_reader.h).
//
//   size_t bytes = commd::ControlBlockBytes(/*ring_capacity=*/2048);
//   // daemon: memfd_create + ftruncate(bytes) + seal + mmap, then InitControlBlock(...)
//   // client: mmap the fd, then RingWriter::Attach(base, bytes, ...)
//
// The layout is a wire format: fixed-width types only, explicit padding, no pointers, every
// offset pinned by a static_assert below. Change it only together with kControlBlockAbiVersion.
//
//   offset           size              section          written by
//   0                128               header           daemon, once, before the client maps it
//   128              64                progress         rank (or its GPU stream)
//   192              64                ring state       rank
//   256              192               counters         rank
//   448              320               abort            daemon
//   768              capacity * 832    ring entries     rank (each entry seqlocked)
//   768 + cap*832    capacity * 32     discovery slots  daemon (each slot seqlocked)
//
// Who writes what matters: each word has exactly one writer process, so no word is ever
// written by both sides. The daemon's "time discovered" stamps therefore live in a side
// array indexed like the ring, tagged with the record id they belong to.
//
// Concurrency: words that change while mapped are plain integers accessed only through
// atomic operations (std::atomic_ref / __atomic builtins), never through plain loads and
// stores. Ring entries and discovery slots use a sequence counter: odd while being written.
// Single writer per word, any number of readers; readers never block the writer.
#ifndef COMMD_COMMON_CONTROL_BLOCK_H_
#define COMMD_COMMON_CONTROL_BLOCK_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "commd/vocabulary.h"

namespace commd {

inline constexpr uint64_t kControlBlockMagic = 0x4b4c4243444d4d43ULL;  // "CMMDCBLK" in memory
inline constexpr uint32_t kControlBlockAbiVersion = 1;

inline constexpr uint32_t kRecordMaxTensors = 8;  // per side (inputs / outputs)
inline constexpr uint32_t kRecordMaxDims = 4;     // per tensor; extra dims fold into the last
inline constexpr uint32_t kRecordNameBytes = 64;  // process group name / desc, NUL included
inline constexpr uint32_t kAbortTextBytes = 256;  // abort reason text, NUL included
// The longest reason an Abort request may give: the abort text also names who asked (at most
// 64 bytes).
inline constexpr uint32_t kMaxAbortReasonBytes = kAbortTextBytes - 1 - 64;
inline constexpr uint32_t kRingMinCapacity = 1;
inline constexpr uint32_t kRingMaxCapacity = 1u << 16;         // ~54 MiB per block at most
inline constexpr int32_t kControlBlockMaxWorldSize = 1 << 16;  // ranks in one group

// The collective an entry records (RingEntry::op): a CollectiveOp with a ring code
// (commd/vocabulary.h, the rows flagged kRing), whose values are this ABI's op codes. Each
// has the name PyTorch's analyzer (torchfrtrace) accepts after the "nccl:" prefix; see
// RecordOpTorchName. The element types of its tensors (RingEntry::input_dtypes) are
// DataType values, PyTorch's ScalarType names in the vocabulary's `scalar` column.
inline constexpr uint32_t kRecordOpCount = 15;
static_assert([] {
  for (int op = 0; op < kCollectiveOpCount; ++op) {
    if (CollectiveInfo(static_cast<CollectiveOp>(op)).ring() != (op < int{kRecordOpCount})) {
      return false;
    }
  }
  return true;
}());
inline constexpr uint32_t kCounterOpSlots = 16;  // per-op counters, room for one more op

enum class RecordState : uint8_t { kScheduled = 0, kStarted = 1, kCompleted = 2 };
inline constexpr uint32_t kRecordStateCount = 3;

// RingEntry::flags bits.
inline constexpr uint8_t kRecordFlagRetired = 1u << 0;    // no longer tracked (done or abandoned)
inline constexpr uint8_t kRecordFlagP2p = 1u << 1;        // send/recv: p2p_seq_id counts it
inline constexpr uint8_t kRecordFlagNan = 1u << 2;        // the fused NaN/Inf check hit
inline constexpr uint8_t kRecordFlagTruncated = 1u << 3;  // tensors or dims beyond the limits
inline constexpr uint8_t kRecordFlagsKnown = 0x0f;

// Why the daemon asks a rank to stop. 0 means "no abort"; the word is futex-able.
enum class AbortReason : uint32_t {
  kNone = 0,
  kAdmin = 1,         // commctl abort / gRPC Abort
  kStuck = 2,         // collective started everywhere, not completed within the timeout
  kLagging = 3,       // some ranks never entered the collective
  kMismatch = 4,      // ranks disagree on op, sizes or dtypes
  kPeerDead = 5,      // a rank of the group died
  kUnresponsive = 6,  // heartbeat stopped with unfinished work
  kNan = 7,           // NaN policy "fail"
  kDaemonShutdown = 8,
};
inline constexpr uint32_t kAbortReasonCount = 9;

struct ControlBlockHeader {
  uint64_t magic;                 // kControlBlockMagic
  uint32_t abi_version;           // kControlBlockAbiVersion
  uint32_t header_bytes;          // sizeof(ControlBlockHeader)
  uint64_t total_bytes;           // ControlBlockBytes(ring_capacity)
  uint32_t ring_capacity;         // power of two in [kRingMinCapacity, kRingMaxCapacity]
  uint32_t entry_bytes;           // sizeof(RingEntry)
  int32_t rank;                   // rank within the group
  int32_t world_size;             // ranks in the group
  int32_t global_rank;            // names the flight-recorder dump file
  uint32_t discovery_slot_bytes;  // sizeof(DiscoverySlot)
  uint64_t progress_offset;
  uint64_t ring_state_offset;
  uint64_t counters_offset;
  uint64_t abort_offset;
  uint64_t ring_offset;
  uint64_t discovery_offset;
  uint64_t created_ns;  // CLOCK_REALTIME when the daemon initialized the block
  uint64_t reserved[3];
};

// Collective sequence ids start at 1; 0 means "none yet". Written by the rank's CPU on the
// host backend, by cuStreamWriteValue64 on GPUs (started / completed).
struct alignas(64) ControlBlockProgress {
  uint64_t last_enqueued_seq;
  uint64_t last_started_seq;
  uint64_t last_completed_seq;
  uint64_t heartbeat_ns;  // writer clock (CLOCK_REALTIME scale) of the last recorder call
  uint64_t reserved[4];
};

struct alignas(64) ControlBlockRingState {
  uint64_t next_record_id;  // entries ever begun; the newest entry is next_record_id - 1
  uint64_t dropped;         // entries overwritten by the ring wrapping
  uint64_t reserved[6];
};

struct alignas(64) ControlBlockCounters {
  uint64_t collectives;  // completed entries
  uint64_t bytes;        // input bytes of completed entries
  uint64_t nan_checks;
  uint64_t nans_found;
  uint64_t abandoned;  // retired without completing (timeout, abort)
  uint64_t reserved[3];
  uint64_t per_op[kCounterOpSlots];  // completed entries by op code (CollectiveOp)
};

struct alignas(64) ControlBlockAbort {
  uint32_t reason;  // AbortReason; set once 0 -> reason, after `text` and `time_ns`
  uint32_t reserved0;
  uint64_t time_ns;
  uint64_t reserved[6];
  char text[kAbortTextBytes];  // NUL-terminated, written before `reason`
};

// One flight-recorder entry. `seq` is the seqlock: odd while the rank rewrites the entry.
// Byte arrays are grouped in 8-byte words so that a reader copies whole words.
struct alignas(64) RingEntry {
  uint64_t seq;
  uint64_t record_id;  // per rank from 0; slot = record_id & (capacity - 1)
  uint64_t pg_id;
  uint64_t collective_seq_id;
  uint64_t p2p_seq_id;
  uint64_t op_id;
  uint64_t time_created_ns;
  uint64_t time_started_ns;    // 0 until started (rank clock)
  uint64_t time_completed_ns;  // 0 until completed (rank clock)
  uint64_t timeout_ms;
  uint64_t bytes;       // sum of input bytes (all inputs, also those beyond the limits)
  uint16_t op;          // CollectiveOp, below kRecordOpCount
  uint8_t state;        // RecordState
  uint8_t flags;        // kRecordFlag*
  int32_t peer;         // p2p peer (group rank), -1 otherwise
  uint8_t num_inputs;   // recorded, <= kRecordMaxTensors
  uint8_t num_outputs;  // recorded, <= kRecordMaxTensors
  uint16_t reserved0;
  uint32_t total_inputs;  // as given, may exceed kRecordMaxTensors
  uint32_t total_outputs;
  uint32_t reserved1;
  uint8_t input_ndims[kRecordMaxTensors];  // recorded dims, <= kRecordMaxDims
  uint8_t output_ndims[kRecordMaxTensors];
  uint8_t input_dtypes[kRecordMaxTensors];  // DataType
  uint8_t output_dtypes[kRecordMaxTensors];
  char pg_name[kRecordNameBytes];  // NUL-terminated
  char pg_desc[kRecordNameBytes];  // NUL-terminated
  int64_t input_dims[kRecordMaxTensors][kRecordMaxDims];
  int64_t output_dims[kRecordMaxTensors][kRecordMaxDims];
  uint8_t reserved2[48];
};

// Daemon-owned twin of a ring slot: when the daemon first saw the entry started / completed.
struct DiscoverySlot {
  uint64_t seq;                 // seqlock, odd while the daemon rewrites the slot
  uint64_t record_id_plus_one;  // 0: empty; else the entry the stamps belong to
  uint64_t discovered_started_ns;
  uint64_t discovered_completed_ns;
};

// The fixed part at the start of every block.
struct ControlBlockFixed {
  ControlBlockHeader header;
  ControlBlockProgress progress;
  ControlBlockRingState ring_state;
  ControlBlockCounters counters;
  ControlBlockAbort abort;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the ABI needs lock-free 32/64-bit atomics");
static_assert(sizeof(ControlBlockHeader) == 128);
static_assert(offsetof(ControlBlockHeader, ring_capacity) == 24);
static_assert(offsetof(ControlBlockHeader, rank) == 32);
static_assert(offsetof(ControlBlockHeader, progress_offset) == 48);
static_assert(offsetof(ControlBlockHeader, discovery_offset) == 88);
static_assert(sizeof(ControlBlockProgress) == 64);
static_assert(sizeof(ControlBlockRingState) == 64);
static_assert(sizeof(ControlBlockCounters) == 192);
static_assert(offsetof(ControlBlockCounters, per_op) == 64);
static_assert(sizeof(ControlBlockAbort) == 320);
static_assert(offsetof(ControlBlockAbort, text) == 64);
static_assert(offsetof(ControlBlockFixed, progress) == 128);
static_assert(offsetof(ControlBlockFixed, ring_state) == 192);
static_assert(offsetof(ControlBlockFixed, counters) == 256);
static_assert(offsetof(ControlBlockFixed, abort) == 448);
static_assert(sizeof(ControlBlockFixed) == 768);
static_assert(offsetof(RingEntry, op) == 88);
static_assert(offsetof(RingEntry, peer) == 92);
static_assert(offsetof(RingEntry, num_inputs) == 96);
static_assert(offsetof(RingEntry, total_inputs) == 100);
static_assert(offsetof(RingEntry, input_ndims) == 112);
static_assert(offsetof(RingEntry, pg_name) == 144);
static_assert(offsetof(RingEntry, pg_desc) == 208);
static_assert(offsetof(RingEntry, input_dims) == 272);
static_assert(offsetof(RingEntry, output_dims) == 528);
static_assert(offsetof(RingEntry, reserved2) == 784);
static_assert(sizeof(RingEntry) == 832 && sizeof(RingEntry) % 64 == 0);
static_assert(sizeof(DiscoverySlot) == 32);
static_assert(kRecordOpCount <= kCounterOpSlots);

inline constexpr uint64_t kProgressOffset = offsetof(ControlBlockFixed, progress);
inline constexpr uint64_t kRingStateOffset = offsetof(ControlBlockFixed, ring_state);
inline constexpr uint64_t kCountersOffset = offsetof(ControlBlockFixed, counters);
inline constexpr uint64_t kAbortOffset = offsetof(ControlBlockFixed, abort);
inline constexpr uint64_t kRingOffset = sizeof(ControlBlockFixed);

constexpr bool IsValidRingCapacity(uint64_t capacity) {
  return capacity >= kRingMinCapacity && capacity <= kRingMaxCapacity &&
         (capacity & (capacity - 1)) == 0;
}

constexpr uint64_t DiscoveryOffset(uint32_t ring_capacity) {
  return kRingOffset + uint64_t{ring_capacity} * sizeof(RingEntry);
}

// Bytes of a block with `ring_capacity` entries; 0 if the capacity is not valid.
constexpr size_t ControlBlockBytes(uint32_t ring_capacity) {
  if (!IsValidRingCapacity(ring_capacity)) return 0;
  return DiscoveryOffset(ring_capacity) + uint64_t{ring_capacity} * sizeof(DiscoverySlot);
}

static_assert(ControlBlockBytes(4) == 768 + 4 * 864);
static_assert(ControlBlockBytes(3) == 0);

// PyTorch's name of a ring op code, as its analyzer expects it after "<lib>:"; nullptr when
// out of range.
constexpr const char* RecordOpTorchName(uint32_t op) {
  return op < kRecordOpCount ? CollectiveName(static_cast<CollectiveOp>(op)) : nullptr;
}

constexpr const char* RecordStateName(uint32_t state) {
  constexpr const char* kNames[kRecordStateCount] = {"scheduled", "started", "completed"};
  return state < kRecordStateCount ? kNames[state] : nullptr;
}

constexpr const char* AbortReasonName(uint32_t reason) {
  constexpr const char* kNames[kAbortReasonCount] = {"none",         "admin",    "stuck",
                                                     "lagging",      "mismatch", "peer_dead",
                                                     "unresponsive", "nan",      "daemon_shutdown"};
  return reason < kAbortReasonCount ? kNames[reason] : nullptr;
}

// The AbortReason for AbortReasonName's spelling (as GetHealth's abort_reason carries it), or
// kAbortReasonCount for anything else.
constexpr uint32_t AbortReasonFromName(std::string_view name) {
  for (uint32_t r = 0; r < kAbortReasonCount; ++r) {
    if (name == AbortReasonName(r)) return r;
  }
  return kAbortReasonCount;
}

// Who stopped the group and why, in words that follow "group G aborted", as the SDK's errors
// and commctl print them: "group G aborted by the watchdog (a collective is stuck): <text>".
// Never null; a value outside the enum (a corrupt block) has words too.
constexpr const char* AbortReasonWords(uint32_t reason) {
  constexpr const char* kWords[kAbortReasonCount] = {
      "(not aborted)",
      "on request",  // the text names the uid and program that asked
      "by the watchdog (a collective is stuck: started on every rank, not completed in time)",
      "by the watchdog (some ranks never entered a collective the others are in)",
      "by the watchdog (ranks disagree on a collective's op, sizes or types)",
      "because a rank of the group died",
      "by the watchdog (a rank stopped its heartbeat with work unfinished)",
      "on a NaN or Inf (the group's nan_policy is fail)",
      "because the daemon is shutting down",
  };
  return reason < kAbortReasonCount ? kWords[reason] : "for a reason this build does not know";
}

}  // namespace commd

#endif  // COMMD_COMMON_CONTROL_BLOCK_H_
