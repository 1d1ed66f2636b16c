#include "daemon/recorder/ring_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/control_block_atomic.h"

namespace commd {
namespace {

using cb_atomic::CopyWordsRelaxed;
using cb_atomic::LoadRelaxed;
using cb_atomic::SeqReadCopy;

// Keeps valid UTF-8 sequences and replaces every other byte with '?', so that names from
// shared memory never break the JSON encoder.
std::string SanitizeUtf8(const char* p, size_t n) {
  std::string out;
  out.reserve(n);
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char b = s[i + k];
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xbf);
    }
    if (ok) {
      out.append(p + i, len);
      i += len;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

bool DecodeName(const char* raw, size_t bytes, std::string* out) {
  const void* nul = std::memchr(raw, '\0', bytes);
  if (nul == nullptr) return false;
  *out = SanitizeUtf8(raw, static_cast<const char*>(nul) - raw);
  return true;
}

std::optional<InvalidReason> DecodeSide(uint8_t num, uint32_t total, const uint8_t* ndims,
                                        const uint8_t* dtypes,
                                        const int64_t (*dims)[kRecordMaxDims],
                                        std::vector<std::vector<int64_t>>* sizes,
                                        std::vector<DataType>* out_dtypes) {
  if (num > kRecordMaxTensors || total < num) return InvalidReason::kTensorCount;
  sizes->resize(num);
  out_dtypes->resize(num);
  for (uint32_t i = 0; i < num; ++i) {
    if (ndims[i] > kRecordMaxDims) return InvalidReason::kDims;
    if (dtypes[i] >= kDataTypeCount) return InvalidReason::kDtype;
    (*out_dtypes)[i] = static_cast<DataType>(dtypes[i]);
    for (uint32_t d = 0; d < ndims[i]; ++d) {
      if (dims[i][d] < 0) return InvalidReason::kDims;
      (*sizes)[i].push_back(dims[i][d]);
    }
  }
  return std::nullopt;
}

// Validates a settled copy of the entry in `slot` and decodes it into `out`.
std::optional<InvalidReason> DecodeEntry(const RingEntry& c, uint32_t slot, uint32_t mask,
                                         uint64_t next_record_id, int32_t world_size,
                                         RecordedEntry* out) {
  const uint64_t capacity = uint64_t{mask} + 1;
  if ((c.record_id & mask) != slot || c.record_id >= next_record_id + capacity) {
    return InvalidReason::kRecordId;
  }
  if (c.state >= kRecordStateCount) return InvalidReason::kState;
  if (c.op >= kRecordOpCount) return InvalidReason::kOp;
  const CollectiveOp op = static_cast<CollectiveOp>(c.op);
  const bool p2p = (c.flags & kRecordFlagP2p) != 0;
  if ((c.flags & ~kRecordFlagsKnown) != 0 ||
      p2p != (op == CollectiveOp::kSend || op == CollectiveOp::kRecv)) {
    return InvalidReason::kFlags;
  }
  if (p2p && (c.peer < 0 || c.peer >= world_size)) return InvalidReason::kPeer;
  if (!DecodeName(c.pg_name, sizeof(c.pg_name), &out->pg_name) ||
      !DecodeName(c.pg_desc, sizeof(c.pg_desc), &out->pg_desc)) {
    return InvalidReason::kName;
  }
  if (auto bad = DecodeSide(c.num_inputs, c.total_inputs, c.input_ndims, c.input_dtypes,
                            c.input_dims, &out->input_sizes, &out->input_dtypes)) {
    return bad;
  }
  if (auto bad = DecodeSide(c.num_outputs, c.total_outputs, c.output_ndims, c.output_dtypes,
                            c.output_dims, &out->output_sizes, &out->output_dtypes)) {
    return bad;
  }
  out->record_id = c.record_id;
  out->pg_id = c.pg_id;
  out->collective_seq_id = c.collective_seq_id;
  out->p2p_seq_id = c.p2p_seq_id;
  out->op_id = c.op_id;
  out->op = op;
  out->peer = p2p ? c.peer : -1;
  out->total_inputs = c.total_inputs;
  out->total_outputs = c.total_outputs;
  out->truncated = (c.flags & kRecordFlagTruncated) != 0;
  out->state = static_cast<RecordState>(c.state);
  out->time_created_ns = c.time_created_ns;
  out->time_started_ns = c.time_started_ns;
  out->time_completed_ns = c.time_completed_ns;
  out->retired = (c.flags & kRecordFlagRetired) != 0;
  out->is_p2p = p2p;
  out->nan_found = (c.flags & kRecordFlagNan) != 0;
  out->timeout_ms = c.timeout_ms;
  out->bytes = c.bytes;
  if (c.time_started_ns != 0 && c.time_completed_ns >= c.time_started_ns) {
    out->duration_ms = double(c.time_completed_ns - c.time_started_ns) / 1e6;
  }
  return std::nullopt;
}

absl::Status Bad(const char* field, uint64_t got, uint64_t want) {
  return absl::DataLossError(
      absl::StrCat("control block header ", field, " is ", got, ", expected ", want));
}

absl::Status CheckHeader(const ControlBlockHeader& h, size_t mapped_bytes,
                         uint32_t expected_capacity) {
  if (h.magic != kControlBlockMagic) return Bad("magic", h.magic, kControlBlockMagic);
  if (h.abi_version != kControlBlockAbiVersion) {
    return Bad("abi_version", h.abi_version, kControlBlockAbiVersion);
  }
  if (h.header_bytes != sizeof(ControlBlockHeader)) {
    return Bad("header_bytes", h.header_bytes, sizeof(ControlBlockHeader));
  }
  if (!IsValidRingCapacity(h.ring_capacity)) {
    return absl::DataLossError(absl::StrCat("control block ring_capacity ", h.ring_capacity,
                                            " is not a power of two in [", kRingMinCapacity, ", ",
                                            kRingMaxCapacity, "]"));
  }
  if (expected_capacity != 0 && h.ring_capacity != expected_capacity) {
    return Bad("ring_capacity", h.ring_capacity, expected_capacity);
  }
  if (h.entry_bytes != sizeof(RingEntry))
    return Bad("entry_bytes", h.entry_bytes, sizeof(RingEntry));
  if (h.discovery_slot_bytes != sizeof(DiscoverySlot)) {
    return Bad("discovery_slot_bytes", h.discovery_slot_bytes, sizeof(DiscoverySlot));
  }
  const uint64_t need = ControlBlockBytes(h.ring_capacity);
  if (h.total_bytes != need) return Bad("total_bytes", h.total_bytes, need);
  if (need > mapped_bytes) {
    return absl::DataLossError(absl::StrCat("control block of ", need,
                                            " bytes does not fit its mapping of ", mapped_bytes));
  }
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> offsets[] = {
      {"progress_offset", {h.progress_offset, kProgressOffset}},
      {"ring_state_offset", {h.ring_state_offset, kRingStateOffset}},
      {"counters_offset", {h.counters_offset, kCountersOffset}},
      {"abort_offset", {h.abort_offset, kAbortOffset}},
      {"ring_offset", {h.ring_offset, kRingOffset}},
      {"discovery_offset", {h.discovery_offset, DiscoveryOffset(h.ring_capacity)}}};
  for (const auto& [name, v] : offsets) {
    if (v.first != v.second) return Bad(name, v.first, v.second);
  }
  if (h.world_size < 1 || h.world_size > kControlBlockMaxWorldSize || h.rank < 0 ||
      h.rank >= h.world_size || h.global_rank < 0) {
    return absl::DataLossError(absl::StrCat(
        "control block rank ", h.rank, " / world size ", h.world_size, " / global rank ",
        h.global_rank, " is not 0 <= rank < world size <= ", kControlBlockMaxWorldSize,
        ", global rank >= 0"));
  }
  return absl::OkStatus();
}

// Everything but the ring. Words are read one at a time: there is no consistency to keep
// across them, and each is a single atomic load.
void ReadFixed(const char* base, RingSnapshot* s) {
  ControlBlockFixed f;
  CopyWordsRelaxed(base + kProgressOffset, &f.progress, sizeof(f) - kProgressOffset);
  s->last_enqueued_seq = f.progress.last_enqueued_seq;
  s->last_started_seq = f.progress.last_started_seq;
  s->last_completed_seq = f.progress.last_completed_seq;
  s->heartbeat_ns = f.progress.heartbeat_ns;
  s->next_record_id = f.ring_state.next_record_id;
  s->dropped = f.ring_state.dropped;
  s->collectives = f.counters.collectives;
  s->bytes = f.counters.bytes;
  s->nan_checks = f.counters.nan_checks;
  s->nans_found = f.counters.nans_found;
  s->abandoned = f.counters.abandoned;
  std::copy_n(f.counters.per_op, kRecordOpCount, s->per_op.begin());
  s->abort_reason = f.abort.reason;
  s->abort_time_ns = f.abort.time_ns;
  const void* nul = std::memchr(f.abort.text, '\0', sizeof(f.abort.text));
  const size_t len = nul ? static_cast<const char*>(nul) - f.abort.text : sizeof(f.abort.text);
  s->abort_text = SanitizeUtf8(f.abort.text, len);
}

void ReadDiscovery(const char* base, uint32_t mask, int max_tries, RecordedEntry* e) {
  const auto* slots = reinterpret_cast<const DiscoverySlot*>(base + DiscoveryOffset(mask + 1));
  DiscoverySlot d;
  if (!SeqReadCopy(&slots[e->record_id & mask], &d, sizeof(d), max_tries)) return;
  if (d.record_id_plus_one != e->record_id + 1) return;
  if (d.discovered_started_ns != 0) e->time_discovered_started_ns = d.discovered_started_ns;
  if (d.discovered_completed_ns != 0) e->time_discovered_completed_ns = d.discovered_completed_ns;
}

void CountInvalid(InvalidReason reason, RingSnapshot* s) {
  ++s->invalid_entries;
  ++s->invalid_by_reason[size_t(reason)];
}

// Validates and decodes one settled copy; valid entries in [from, end) are kept.
void TakeEntry(const char* base, const RingEntry& copy, uint32_t slot, uint32_t mask, uint64_t next,
               uint64_t from, uint64_t end, int max_tries, RingSnapshot* s) {
  RecordedEntry e;
  if (auto bad = DecodeEntry(copy, slot, mask, next, s->world_size, &e)) {
    CountInvalid(*bad, s);
    return;
  }
  if (e.record_id < from || e.record_id >= end) return;
  ReadDiscovery(base, mask, max_tries, &e);
  s->entries.push_back(std::move(e));
}

// The number of slots to read, newest first from record next - 1: those of the records in
// [from, next), at most the ring and at most max_entries.
uint64_t SlotsToRead(const RingReadOptions& options, uint64_t next, uint64_t capacity) {
  const uint64_t from = options.from_record_id.value_or(0);
  uint64_t span =
      !options.from_record_id || next < from || next - from >= capacity ? capacity : next - from;
  if (options.max_entries != 0) span = std::min<uint64_t>(span, options.max_entries);
  return span;
}

// Scans `span` slots newest first, from the slot of record next - 1 backwards. The writer
// overwrites the oldest slots forwards meanwhile, so a rank that records faster than we read
// costs the snapshot its oldest entries (their slots hold records >= next by the time we
// reach them, which are left out), never its newest. Entries are validated as they are
// copied, against `next`; only a record id beyond that bound waits in `late` for the
// next_record_id read after the scan (the writer may have lapped us). Returns whether the
// writer had lapped the whole ring before the first read: the newest slot held a newer record.
bool ScanNewestFirst(const char* base, const RingReadOptions& options, uint64_t next, uint64_t span,
                     uint32_t* budget, RingSnapshot* s,
                     std::vector<std::pair<uint32_t, RingEntry>>* late) {
  const uint32_t mask = s->ring_capacity - 1;
  const uint64_t capacity = uint64_t{mask} + 1;
  const auto* ring = reinterpret_cast<const RingEntry*>(base + kRingOffset);
  const uint32_t per_record = static_cast<uint32_t>(std::clamp(options.max_tries, 1, 1 << 20));
  const uint64_t from = options.from_record_id.value_or(0);
  bool head_lapped = false;
  RingEntry copy;
  for (uint64_t k = 0; k < span; ++k) {
    const uint32_t slot = static_cast<uint32_t>((next - 1 - k) & mask);
    // A slot never written has seq 0 for good: one load instead of copying 832 bytes (a
    // ring not yet full is mostly such slots).
    if (LoadRelaxed(&ring[slot].seq) == 0) continue;
    const int tries =
        static_cast<int>(std::max<uint32_t>(1, std::min<uint32_t>(*budget, per_record)));
    int used = 0;
    const bool settled = SeqReadCopy(&ring[slot], &copy, sizeof(copy), tries, &used);
    *budget -= std::min<uint32_t>(*budget, used - 1);
    if (!settled) {
      CountInvalid(InvalidReason::kUnsettled, s);
      continue;
    }
    if (copy.seq == 0) continue;  // never written
    if (k == 0) head_lapped = (copy.record_id & mask) == slot && copy.record_id >= next;
    if ((copy.record_id & mask) == slot && copy.record_id >= next + capacity) {
      late->emplace_back(slot, copy);
      continue;
    }
    TakeEntry(base, copy, slot, mask, next, from, next, options.max_tries, s);
  }
  // Newest first as read; the snapshot lists them oldest first.
  std::reverse(s->entries.begin(), s->entries.end());
  return head_lapped;
}

// A writer that laps the whole ring between our read of next_record_id and of the newest
// slot leaves that scan nothing; so many fresh scans from its new head, at most.
constexpr int kMaxRescans = 2;

void ReadRing(const char* base, const RingReadOptions& options, RingSnapshot* s) {
  const uint64_t capacity = s->ring_capacity;
  const auto* ring_state = reinterpret_cast<const ControlBlockRingState*>(base + kRingStateOffset);
  uint32_t budget = options.retry_budget;  // shared by the rescans: work stays bounded
  // The snapshot holds the records begun before the scan, [.., next): one begun while we
  // read (the writer runs on) is left out, so that a dump is a prefix of the rank's history
  // in which every entry but the newest had finished when the newest began.
  uint64_t next = s->next_record_id;
  uint64_t final_next = next;
  std::vector<std::pair<uint32_t, RingEntry>> late;
  for (int rescans = 0;; ++rescans) {
    const uint64_t span = SlotsToRead(options, next, capacity);
    s->entries.reserve(std::min<uint64_t>(span, next));
    const bool head_lapped = ScanNewestFirst(base, options, next, span, &budget, s, &late);
    final_next = LoadRelaxed(&ring_state->next_record_id);
    if (!head_lapped || final_next <= next || rescans == kMaxRescans) break;
    next = s->next_record_id = final_next;
    s->entries.clear();
    s->invalid_entries = 0;
    s->invalid_by_reason = {};
    late.clear();
  }
  const uint32_t mask = s->ring_capacity - 1;
  const uint64_t from = options.from_record_id.value_or(0);
  for (const auto& [slot, c] : late) {
    TakeEntry(base, c, slot, mask, final_next, from, next, options.max_tries, s);
  }
  // Only a block whose next_record_id went backwards (never an honest writer) can leave
  // entries beyond the final bound; they are dropped as record-id errors.
  const uint64_t bound = final_next + capacity;
  if (final_next < next || bound < final_next) {
    const size_t before = s->entries.size();
    std::erase_if(s->entries, [&](const RecordedEntry& e) { return e.record_id >= bound; });
    for (size_t i = s->entries.size(); i < before; ++i) CountInvalid(InvalidReason::kRecordId, s);
  }
  // In order already, but for a block whose words changed under us.
  auto by_id = [](const RecordedEntry& a, const RecordedEntry& b) {
    return a.record_id < b.record_id;
  };
  if (!std::is_sorted(s->entries.begin(), s->entries.end(), by_id)) {
    std::sort(s->entries.begin(), s->entries.end(), by_id);
  }
}

}  // namespace

absl::StatusOr<RingSnapshot> ReadControlBlock(const void* base, size_t mapped_bytes,
                                              const RingReadOptions& options) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 8 != 0) {
    return absl::InvalidArgumentError("control block base must be non-null and 8-byte aligned");
  }
  if (mapped_bytes < sizeof(ControlBlockFixed)) {
    return absl::DataLossError(absl::StrCat("control block mapping of ", mapped_bytes,
                                            " bytes is smaller than its fixed part of ",
                                            sizeof(ControlBlockFixed)));
  }
  const char* b = static_cast<const char*>(base);
  ControlBlockHeader h;
  CopyWordsRelaxed(b, &h, sizeof(h));
  if (absl::Status st = CheckHeader(h, mapped_bytes, options.expected_capacity); !st.ok()) {
    return st;
  }
  RingSnapshot s;
  s.abi_version = h.abi_version;
  s.ring_capacity = h.ring_capacity;
  s.total_bytes = h.total_bytes;
  s.rank = h.rank;
  s.world_size = h.world_size;
  s.global_rank = h.global_rank;
  s.created_ns = h.created_ns;
  ReadFixed(b, &s);
  if (options.include_entries) ReadRing(b, options, &s);
  return s;
}

absl::Status StampDiscoveries(void* base, size_t mapped_bytes, uint64_t now_ns,
                              RingSnapshot* snapshot) {
  const uint32_t capacity = snapshot->ring_capacity;
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 8 != 0 ||
      ControlBlockBytes(capacity) == 0 || ControlBlockBytes(capacity) > mapped_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("cannot stamp discoveries: ring capacity ",
                                                   capacity, " does not fit a mapping of ",
                                                   mapped_bytes, " bytes"));
  }
  auto* slots =
      reinterpret_cast<DiscoverySlot*>(static_cast<char*>(base) + DiscoveryOffset(capacity));
  for (RecordedEntry& e : snapshot->entries) {
    if (e.state == RecordState::kScheduled) continue;
    const bool completed = e.state == RecordState::kCompleted;
    DiscoverySlot* slot = &slots[e.record_id & (capacity - 1)];
    DiscoverySlot d{};
    // We are the slot's only writer: an unsettled slot was scribbled on; overwrite it.
    if (!SeqReadCopy(slot, &d, sizeof(d), 2)) d = DiscoverySlot{};
    if (d.record_id_plus_one != e.record_id + 1) {
      d.record_id_plus_one = e.record_id + 1;
      d.discovered_started_ns = now_ns;
      d.discovered_completed_ns = completed ? now_ns : 0;
    } else if (completed && d.discovered_completed_ns == 0) {
      if (d.discovered_started_ns == 0) d.discovered_started_ns = now_ns;
      d.discovered_completed_ns = now_ns;
    } else {
      continue;
    }
    const uint64_t s = cb_atomic::SeqWriteBegin(&slot->seq);
    cb_atomic::StoreRelaxed(&slot->record_id_plus_one, d.record_id_plus_one);
    cb_atomic::StoreRelaxed(&slot->discovered_started_ns, d.discovered_started_ns);
    cb_atomic::StoreRelaxed(&slot->discovered_completed_ns, d.discovered_completed_ns);
    cb_atomic::SeqWriteEnd(&slot->seq, s);
    e.time_discovered_started_ns = d.discovered_started_ns;
    if (completed) e.time_discovered_completed_ns = d.discovered_completed_ns;
  }
  return absl::OkStatus();
}

}  // namespace commd
