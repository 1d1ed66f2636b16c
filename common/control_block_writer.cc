#include "common/control_block_writer.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/control_block_atomic.h"

namespace commd {
namespace {

using cb_atomic::LoadAcquire;
using cb_atomic::LoadRelaxed;
using cb_atomic::StoreRelaxed;
using cb_atomic::StoreRelease;
using cb_atomic::StoreWordRelaxed;

struct SideResult {
  uint64_t bytes = 0;
  uint8_t recorded = 0;
  uint32_t total = 0;
  bool truncated = false;
};

// Writes one side's tensors (ndims, dtypes, dims) and returns what the entry's header needs.
// Dims beyond kRecordMaxDims fold into the last recorded one so that numel stays right.
// What WriteAnySide returns, without writing.
SideResult MeasureSide(std::span<const TensorDesc> tensors) {
  SideResult r;
  r.total = static_cast<uint32_t>(std::min<size_t>(tensors.size(), UINT32_MAX));
  r.recorded = static_cast<uint8_t>(std::min<size_t>(tensors.size(), kRecordMaxTensors));
  r.truncated = tensors.size() > kRecordMaxTensors;
  for (const TensorDesc& t : tensors) {
    int64_t numel = 1;
    for (uint32_t d = 0; d < t.ndim; ++d) numel *= t.dims[d];
    r.bytes += uint64_t(std::max<int64_t>(numel, 0)) * DataTypeSize(t.dtype);
  }
  for (size_t i = 0; i < r.recorded; ++i) r.truncated |= tensors[i].ndim > kRecordMaxDims;
  return r;
}

[[gnu::noinline]] SideResult WriteAnySide(std::span<const TensorDesc> tensors, uint8_t* ndims_out,
                                          uint8_t* dtypes_out,
                                          int64_t (*dims_out)[kRecordMaxDims]) {
  SideResult r;
  r.total = static_cast<uint32_t>(std::min<size_t>(tensors.size(), UINT32_MAX));
  r.recorded = static_cast<uint8_t>(std::min<size_t>(tensors.size(), kRecordMaxTensors));
  r.truncated = tensors.size() > kRecordMaxTensors;
  // Built in registers: byte stores into a stack array re-read as a word stall on
  // store-to-load forwarding (it was half of Begin's cost).
  uint64_t ndims_word = 0;
  uint64_t dtypes_word = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    int64_t numel = 1;
    for (uint32_t d = 0; d < t.ndim; ++d) numel *= t.dims[d];
    r.bytes += uint64_t(std::max<int64_t>(numel, 0)) * DataTypeSize(t.dtype);
    if (i >= kRecordMaxTensors) continue;
    const uint32_t nd = std::min(t.ndim, kRecordMaxDims);
    ndims_word |= uint64_t{nd} << (8 * i);
    dtypes_word |= uint64_t{static_cast<uint8_t>(t.dtype)} << (8 * i);
    for (uint32_t d = 0; d < nd; ++d) {
      int64_t v = t.dims[d];
      if (d == nd - 1 && t.ndim > nd) {
        for (uint32_t k = nd; k < t.ndim; ++k) v *= t.dims[k];
        r.truncated = true;
      }
      StoreRelaxed(&dims_out[i][d], v);
    }
  }
  // The ABI's byte arrays are little-endian words: byte i is tensor i.
  static_assert(std::endian::native == std::endian::little);
  StoreWordRelaxed(ndims_out, ndims_word);
  StoreWordRelaxed(dtypes_out, dtypes_word);
  return r;
}

// No tensor (barrier) or one 1-D tensor (every SDK collective on one buffer): WriteAnySide's
// result without its loop's bookkeeping and register saves (they were most of an entry's
// cost); anything else goes there.
inline SideResult WriteSide(std::span<const TensorDesc> tensors, uint8_t* ndims_out,
                            uint8_t* dtypes_out, int64_t (*dims_out)[kRecordMaxDims]) {
  if (tensors.empty()) {
    StoreWordRelaxed(ndims_out, uint64_t{0});
    StoreWordRelaxed(dtypes_out, uint64_t{0});
    return {};
  }
  if (tensors.size() == 1 && tensors[0].ndim == 1) {
    const TensorDesc& t = tensors[0];
    const int64_t numel = t.dims[0];
    StoreRelaxed(&dims_out[0][0], numel);
    StoreWordRelaxed(ndims_out, uint64_t{1});
    StoreWordRelaxed(dtypes_out, uint64_t{static_cast<uint8_t>(t.dtype)});
    return {.bytes = uint64_t(std::max<int64_t>(numel, 0)) * DataTypeSize(t.dtype),
            .recorded = 1,
            .total = 1};
  }
  return WriteAnySide(tensors, ndims_out, dtypes_out, dims_out);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingWriter>> RingWriter::Attach(void* base, size_t mapped_bytes,
                                                               RingWriterOptions options) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 64 != 0 ||
      mapped_bytes < sizeof(ControlBlockFixed)) {
    return absl::FailedPreconditionError(
        absl::StrCat("control block mapping of ", mapped_bytes,
                     " bytes is null, unaligned or smaller than its fixed part"));
  }
  const auto* h = static_cast<const ControlBlockHeader*>(base);
  const uint64_t magic = LoadRelaxed(&h->magic);
  const uint32_t version = LoadRelaxed(&h->abi_version);
  const uint32_t capacity = LoadRelaxed(&h->ring_capacity);
  if (magic != kControlBlockMagic || version != kControlBlockAbiVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("control block magic ", magic, " / ABI version ", version,
                     " is not this SDK's ", kControlBlockMagic, " / ", kControlBlockAbiVersion));
  }
  if (ControlBlockBytes(capacity) == 0 || ControlBlockBytes(capacity) > mapped_bytes ||
      LoadRelaxed(&h->total_bytes) != ControlBlockBytes(capacity) ||
      LoadRelaxed(&h->entry_bytes) != sizeof(RingEntry)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "control block ring capacity ", capacity, " (", ControlBlockBytes(capacity),
        " bytes) does not fit the mapping of ", mapped_bytes, " bytes or the header's sizes"));
  }
  if (!options.clock) options.clock = NewTscRecorderClock();
  std::unique_ptr<RingWriter> w(new RingWriter(static_cast<char*>(base), std::move(options.clock)));
  w->mask_ = capacity - 1;
  w->slot_holds_ = std::make_unique<SlotHolds[]>(capacity);  // no slot written yet
  w->next_record_id_ = LoadRelaxed(&w->ring_state_->next_record_id);
  w->dropped_ = LoadRelaxed(&w->ring_state_->dropped);
  auto pg = w->RegisterProcessGroup(options.pg_id, options.pg_name, options.pg_desc);
  if (!pg.ok()) return pg.status();
  return w;
}

RingWriter::RingWriter(char* base, std::unique_ptr<RecorderClock> clock)
    : progress_(reinterpret_cast<ControlBlockProgress*>(base + kProgressOffset)),
      ring_state_(reinterpret_cast<ControlBlockRingState*>(base + kRingStateOffset)),
      counters_(reinterpret_cast<ControlBlockCounters*>(base + kCountersOffset)),
      abort_(reinterpret_cast<const ControlBlockAbort*>(base + kAbortOffset)),
      ring_(reinterpret_cast<RingEntry*>(base + kRingOffset)),
      clock_(std::move(clock)) {}

void RingWriter::SetName(uint64_t* words, std::string_view text) {
  size_t n = std::min<size_t>(text.size(), kRecordNameBytes - 1);
  // Never leave half a UTF-8 character: back off over continuation bytes.
  if (n < text.size()) {
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xc0) == 0x80) --n;
  }
  char buf[kRecordNameBytes] = {};
  std::memcpy(buf, text.data(), n);
  std::memcpy(words, buf, sizeof(buf));
}

absl::StatusOr<uint32_t> RingWriter::RegisterProcessGroup(uint64_t pg_id, std::string_view name,
                                                          std::string_view desc) {
  if (num_groups_ >= kMaxProcessGroups) {
    return absl::ResourceExhaustedError(absl::StrCat("recorder already has ", kMaxProcessGroups,
                                                     " process groups; cannot add '",
                                                     std::string(name), "'"));
  }
  Group& g = groups_[num_groups_];
  g.pg_id = pg_id;
  SetName(g.name_words, name);
  SetName(g.desc_words, desc);
  return num_groups_++;
}

RecordShape RingWriter::Prepare(const RecordArgs& args) {
  static std::atomic<uint64_t> last_id{0};
  RecordShape shape{.args = args, .id = last_id.fetch_add(1, std::memory_order_relaxed) + 1};
  const SideResult in = MeasureSide(args.inputs);
  const SideResult out = MeasureSide(args.outputs);
  shape.bytes = in.bytes;
  shape.flags = static_cast<uint8_t>((IsP2p(args.op) ? kRecordFlagP2p : 0) |
                                     (in.truncated || out.truncated ? kRecordFlagTruncated : 0));
  return shape;
}

RingWriter::ShapeFacts RingWriter::WriteShape(RingEntry* e, const RecordShape& shape, uint32_t pg,
                                              SlotHolds& holds) {
  const Group& g = groups_[pg];
  if (holds.group != pg + 1) {
    StoreRelaxed(&e->pg_id, g.pg_id);
    for (size_t i = 0; i < kRecordNameBytes / 8; ++i) {
      StoreWordRelaxed(e->pg_name + 8 * i, g.name_words[i]);
      StoreWordRelaxed(e->pg_desc + 8 * i, g.desc_words[i]);
    }
    holds.group = static_cast<uint8_t>(pg + 1);
  }
  holds.shape = shape.id;
  const RecordArgs& a = shape.args;
  const bool p2p = IsP2p(a.op);
  StoreRelaxed(&e->timeout_ms, a.timeout_ms);
  SideResult in = WriteSide(a.inputs, e->input_ndims, e->input_dtypes, e->input_dims);
  SideResult out = WriteSide(a.outputs, e->output_ndims, e->output_dtypes, e->output_dims);
  StoreRelaxed(&e->bytes, in.bytes);
  StoreRelaxed(&e->op, static_cast<uint16_t>(a.op));
  StoreRelaxed(&e->peer, p2p ? a.peer : int32_t{-1});
  StoreRelaxed(&e->num_inputs, in.recorded);
  StoreRelaxed(&e->num_outputs, out.recorded);
  StoreRelaxed(&e->total_inputs, in.total);
  StoreRelaxed(&e->total_outputs, out.total);
  return {
      .bytes = in.bytes,
      .flags = static_cast<uint8_t>((p2p ? kRecordFlagP2p : 0) |
                                    (in.truncated || out.truncated ? kRecordFlagTruncated : 0))};
}

RecordHandle RingWriter::Record(const RecordShape& shape, bool started) {
  const RecordArgs& args = shape.args;
  const uint64_t now = clock_->NowNs();
  const uint32_t pg = args.pg < num_groups_ ? args.pg : 0;
  Group& g = groups_[pg];
  const bool p2p = IsP2p(args.op);
  if (!args.same_seq_as_previous || (p2p ? g.p2p_seq : g.collective_seq) == 0) {
    ++(p2p ? g.p2p_seq : g.collective_seq);
  }
  ++g.op_id;
  RecordHandle h;
  h.record_id = next_record_id_;
  h.collective_seq_id = p2p ? 0 : g.collective_seq;
  h.op = args.op;

  RingEntry* e = Slot(h.record_id);
  if (h.record_id > mask_) StoreRelaxed(&ring_state_->dropped, ++dropped_);
  const uint64_t s = cb_atomic::SeqWriteBegin(&e->seq);
  SlotHolds& holds = slot_holds_[h.record_id & mask_];
  ShapeFacts facts{.bytes = shape.bytes, .flags = shape.flags};
  if (shape.id == 0 || holds.shape != shape.id || holds.group != pg + 1) {
    facts = WriteShape(e, shape, pg, holds);
  }
  h.bytes = facts.bytes;
  StoreRelaxed(&e->record_id, h.record_id);
  StoreRelaxed(&e->collective_seq_id, g.collective_seq);
  StoreRelaxed(&e->p2p_seq_id, g.p2p_seq);
  StoreRelaxed(&e->op_id, g.op_id);
  StoreRelaxed(&e->time_created_ns, now);
  StoreRelaxed(&e->time_started_ns, started ? now : uint64_t{0});
  StoreRelaxed(&e->time_completed_ns, uint64_t{0});
  StoreRelaxed(&e->state,
               static_cast<uint8_t>(started ? RecordState::kStarted : RecordState::kScheduled));
  StoreRelaxed(&e->flags, facts.flags);
  cb_atomic::SeqWriteEnd(&e->seq, s);

  next_record_id_ = h.record_id + 1;
  StoreRelease(&ring_state_->next_record_id, next_record_id_);
  if (!p2p) {
    StoreRelaxed(&progress_->last_enqueued_seq, h.collective_seq_id);
    if (started) StoreRelaxed(&progress_->last_started_seq, h.collective_seq_id);
  }
  StoreRelaxed(&progress_->heartbeat_ns, now);
  return h;
}

void RingWriter::MarkStarted(const RecordHandle& h, bool write_progress) {
  const uint64_t now = clock_->NowNs();
  if (RingEntry* e = Live(h.record_id)) {
    const uint64_t s = cb_atomic::SeqWriteBegin(&e->seq);
    StoreRelaxed(&e->state, static_cast<uint8_t>(RecordState::kStarted));
    StoreRelaxed(&e->time_started_ns, now);
    cb_atomic::SeqWriteEnd(&e->seq, s);
  }
  if (write_progress && h.collective_seq_id != 0) {
    StoreRelaxed(&progress_->last_started_seq, h.collective_seq_id);
  }
  StoreRelaxed(&progress_->heartbeat_ns, now);
}

void RingWriter::MarkCompleted(const RecordHandle& h, bool write_progress) {
  const uint64_t now = clock_->NowNs();
  if (RingEntry* e = Live(h.record_id)) {
    const uint64_t s = cb_atomic::SeqWriteBegin(&e->seq);
    StoreRelaxed(&e->state, static_cast<uint8_t>(RecordState::kCompleted));
    StoreRelaxed(&e->time_completed_ns, now);
    StoreRelaxed(&e->flags, static_cast<uint8_t>(LoadRelaxed(&e->flags) | kRecordFlagRetired));
    cb_atomic::SeqWriteEnd(&e->seq, s);
  }
  Bump(&counters_->collectives);
  Bump(&counters_->bytes, h.bytes);
  const uint32_t op = static_cast<uint32_t>(h.op);
  if (op < kCounterOpSlots) Bump(&counters_->per_op[op]);
  if (write_progress && h.collective_seq_id != 0) {
    StoreRelaxed(&progress_->last_completed_seq, h.collective_seq_id);
  }
  StoreRelaxed(&progress_->heartbeat_ns, now);
}

void RingWriter::Abandon(const RecordHandle& h) {
  if (RingEntry* e = Live(h.record_id)) {
    const uint64_t s = cb_atomic::SeqWriteBegin(&e->seq);
    StoreRelaxed(&e->flags, static_cast<uint8_t>(LoadRelaxed(&e->flags) | kRecordFlagRetired));
    cb_atomic::SeqWriteEnd(&e->seq, s);
  }
  Bump(&counters_->abandoned);
}

void RingWriter::NanChecked(const RecordHandle& h, bool nan_found) {
  Bump(&counters_->nan_checks);
  if (!nan_found) return;
  Bump(&counters_->nans_found);
  if (RingEntry* e = Live(h.record_id)) {
    const uint64_t s = cb_atomic::SeqWriteBegin(&e->seq);
    StoreRelaxed(&e->flags, static_cast<uint8_t>(LoadRelaxed(&e->flags) | kRecordFlagNan));
    cb_atomic::SeqWriteEnd(&e->seq, s);
  }
}

void RingWriter::Heartbeat() { StoreRelaxed(&progress_->heartbeat_ns, clock_->NowNs()); }

AbortReason RingWriter::abort_reason() const {
  const uint32_t r = LoadAcquire(&abort_->reason);
  return r < kAbortReasonCount ? static_cast<AbortReason>(r) : AbortReason::kAdmin;
}

std::string RingWriter::abort_text() const {
  char buf[kAbortTextBytes];
  for (size_t i = 0; i < sizeof(buf); ++i) buf[i] = LoadRelaxed(&abort_->text[i]);
  buf[sizeof(buf) - 1] = '\0';
  return std::string(buf);
}

}  // namespace commd
