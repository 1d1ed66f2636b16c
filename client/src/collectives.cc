// Group's collectives: each public call describes itself in a CollectiveCall and goes through
// Group::Run, which checks the arguments, resolves the buffers' views and the all-reduce
// algorithm (the group's one-shot threshold from JoinGroupResponse.collectives), prepares the
// flight-recorder entry with the group's NaN/Inf check and policy, and hands the call to the
// backend the group chose when it was joined (collective_call.h).
#include "kernels/host/collectives.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/src/collective_call.h"
#include "client/src/group_aborted.h"
#include "client/src/group_state.h"
#include "client/src/span_collectives.h"
#include "commd/group.h"
#include "common/control_block.h"
#include "common/status_macros.h"
#include "kernels/algorithm.h"
#include "kernels/host/fused_matmul.h"
#include "kernels/types.h"

namespace commd {
namespace {

// What a collective takes and how its buffers are sized: its row of the vocabulary
// (commd/vocabulary.h).
using Shape = vocabulary::CollectiveRow;
constexpr const Shape& ShapeOf(CollectiveOp kind) { return CollectiveInfo(kind); }

// Which buffer a message is about: "all-gather input", or "all-reduce" for one buffer.
struct Side {
  const char* words;
  const char* side;  // "" for a collective on one buffer
};
std::string Name(const Side& s) { return absl::StrCat(s.words, *s.side ? " " : "", s.side); }

// The options' checks, inline: a call whose argument checks were skipped still pays these
// few comparisons, and builds a message only when one fails (OptionsError).
bool OptionsValid(const CollectiveOptions& o) {
  using N = CollectiveOptions::NanCheck;
  return o.nan_check >= N::kDefault && o.nan_check <= N::kSampled &&
         o.timeout >= absl::ZeroDuration() &&
         (o.nan_check != N::kSampled || (o.nan_sample_period >= kMinNanSamplePeriod &&
                                         o.nan_sample_period <= kMaxNanSamplePeriod));
}

// Why OptionsValid(o) is false.
[[gnu::noinline]] absl::Status OptionsError(const CollectiveOptions& o) {
  using N = CollectiveOptions::NanCheck;
  if (o.nan_check < N::kDefault || o.nan_check > N::kSampled) {
    return absl::InvalidArgumentError(
        absl::StrCat("nan_check ", static_cast<int>(o.nan_check),
                     " is not one of default (0), off (1), on (2), sampled (3)"));
  }
  if (o.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(o.timeout),
                     " is negative (allowed: > 0, or 0 for twice the group's timeout)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("nan_sample_period ", o.nan_sample_period,
                                                 " is out of range [", kMinNanSamplePeriod, ", ",
                                                 kMaxNanSamplePeriod, "]"));
}

absl::Status CheckOptions(const CollectiveOptions& o) {
  return OptionsValid(o) ? absl::OkStatus() : OptionsError(o);
}

size_t ElementSize(DataType dtype) { return DataTypeSize(dtype); }

// `elements` of `dtype` at byte `offset` must fit `buf`'s data bytes. `what` names the
// buffer, and `tensor` the coalesced tensor (-1: none).
absl::Status CheckFits(const Side& what, long tensor, const SymmetricBuffer& buf, size_t offset,
                       size_t elements, DataType dtype) {
  const size_t es = ElementSize(dtype);
  const size_t size = buf.size();
  if (offset <= size && elements <= (size - offset) / es && offset % es == 0) {
    return absl::OkStatus();
  }
  const std::string name = tensor < 0 ? Name(what) : absl::StrCat(Name(what), " tensor ", tensor);
  if (offset > size || elements > (size - offset) / es) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", elements, " elements of ", es, " bytes at offset ", offset,
                     " do not fit the buffer's ", size, " bytes (allowed: at most ",
                     offset > size ? 0 : (size - offset) / es, " elements)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": offset ", offset, " is not a multiple of the element size ", es));
}

absl::Status CheckOwned(const Side& what, bool owned, const SymmetricBuffer& buf) {
  if (owned) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Name(what), " buffer ", buf.id(),
                                                 " was not allocated by this group for this rank"));
}

// One pointer of a host-memory call: non-null, aligned, outside every rank's part of the
// staging buffer (whose views the kernels read; the kernels would take memory inside this
// rank's part for an in-place input, which these overloads do not mean).
absl::Status CheckHostPointer(const Side& what, const void* p, size_t bytes, size_t es,
                              SymmetricBuffer& staging, int world_size) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(what), " is null (allowed: non-null for count > 0)"));
  }
  if (begin % es != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Name(what), " 0x", absl::Hex(begin),
                                                   " is not aligned to the element size ", es));
  }
  for (int r = 0; r < world_size; ++r) {
    const auto part = reinterpret_cast<uintptr_t>(staging.peer(r));
    if (begin < part + staging.size() && part < begin + bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          Name(what), " [0x", absl::Hex(begin), ", +", bytes, " bytes) overlaps rank ", r,
          "'s part of staging buffer ", staging.id(),
          "; allowed: memory outside the staging buffer (data already in a symmetric buffer "
          "take the SymmetricBuffer overloads)"));
    }
  }
  return absl::OkStatus();
}

// The host-memory overloads: the input fits the staging buffer (and the output, for a group
// spanning nodes, whose results come back through it: `staged_out`), and the pointers.
absl::Status CheckHostMemory(const CollectiveCall& c, const Shape& shape, size_t in_count,
                             size_t out_count, int local_world_size, bool staged_out) {
  SymmetricBuffer& staging = *c.in;
  const size_t es = ElementSize(c.dtype);
  const size_t slots = staged_out ? std::max(in_count, out_count) : in_count;
  const size_t capacity = staging.size() / es / slots;
  if (c.count > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": count ", c.count, " x ", DataTypeName(c.dtype),
                     slots > 1 ? absl::StrCat(" x world size ", slots) : "",
                     " does not fit staging buffer ", staging.id(), " of ", staging.size(),
                     " bytes per rank (allowed: count at most ", capacity, ")"));
  }
  if (c.count == 0) return absl::OkStatus();  // a no-op: no memory is read or written
  if (shape.one_buffer()) {  // broadcast and all-reduce: input and output are the one buffer
    const bool one = c.input == c.output;
    RETURN_IF_ERROR(CheckHostPointer({shape.words, one ? "buffer" : "input"}, c.input, c.count * es,
                                     es, staging, local_world_size));
    if (one) return absl::OkStatus();
  } else {
    RETURN_IF_ERROR(CheckHostPointer({shape.words, "input"}, c.input, c.count * in_count * es, es,
                                     staging, local_world_size));
  }
  return CheckHostPointer({shape.words, "output"}, c.output, c.count * out_count * es, es, staging,
                          local_world_size);
}

// The fused matmuls' operands and the room they take in the call's symmetric buffer (the
// kernels check the same again; these messages name the public call).
absl::Status CheckMatmul(const CollectiveCall& c, const Shape& shape, int world_size) {
  const MatmulCall& m = *c.matmul;
  const bool gather = c.kind == CollectiveOp::kAllGatherMatmul;
  constexpr size_t kMaxDim = INT32_MAX;  // sgemm's int dimensions
  if (!IsFloatingPoint(c.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(shape.words, ": data type ",
                                                   DataTypeName(c.dtype),
                                                   " is not one of float32, float16, bfloat16"));
  }
  if (m.rows == 0 || m.k == 0 || m.rows > kMaxDim || m.k > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(shape.words, ": rows ", m.rows, " and k ", m.k,
                                                   " must be in [1, ", kMaxDim, "]"));
  }
  const size_t max_bs = gather ? kernels::kMaxMatmulBs : 1;
  if (m.bs.empty() || m.bs.size() > max_bs) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": ", m.bs.size(), " Bs (allowed: 1 to ", max_bs, ")"));
  }
  for (size_t i = 0; i < m.bs.size(); ++i) {
    const MatmulB& b = m.bs[i];
    if (b.data == nullptr || b.out == nullptr || b.n == 0 || b.n > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape.words, ": B ", i, " needs non-null data and out and n in [1, ",
                       kMaxDim, "]; got n ", b.n, b.data == nullptr ? ", null data" : "",
                       b.out == nullptr ? ", null out" : ""));
    }
  }
  const size_t es = ElementSize(c.dtype), size = c.in->size();
  const auto w = static_cast<size_t>(world_size);
  if (gather) {
    const bool fits = m.k <= size / es / m.rows;
    const size_t shard = fits ? m.rows * m.k * es : SIZE_MAX;
    const size_t need =
        m.row_scale == nullptr || !fits ? shard : (shard + 63) / 64 * 64 + m.rows * sizeof(float);
    if (!fits || need > size) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape.words, ": a shard of ", m.rows, " x ", m.k, " ", DataTypeName(c.dtype),
                       m.row_scale != nullptr ? " and its row scales" : "", " does not fit buffer ",
                       c.in->id(), " of ", size, " bytes per rank"));
    }
    return absl::OkStatus();
  }
  if (m.a == nullptr) return absl::InvalidArgumentError(absl::StrCat(shape.words, ": A is null"));
  if (m.rows % w != 0) {
    return absl::InvalidArgumentError(absl::StrCat(shape.words, ": A's ", m.rows,
                                                   " rows are not divisible by the world size ", w,
                                                   " (allowed: a multiple of ", w, ")"));
  }
  if (c.op != ReduceOp::kSum && c.op != ReduceOp::kAvg) {
    return absl::InvalidArgumentError(absl::StrCat(
        shape.words, ": reduce op ", static_cast<int>(c.op), " is not one of sum (0), avg (1)"));
  }
  if (m.bs[0].n > size / sizeof(float) / m.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": the float32 partial products of ", m.rows, " x ", m.bs[0].n,
                     " do not fit workspace ", c.in->id(), " of ", size,
                     " bytes per rank (allowed: n at most ", size / sizeof(float) / m.rows, ")"));
  }
  return absl::OkStatus();
}

// The call's buffers and sizes (its options, types and op checked already). `world_size` is
// the group's over every node; `local_world_size` this node's part of it.
absl::Status CheckBuffers(const CollectiveCall& c, const Shape& shape, bool owns_in, bool owns_out,
                          int local_world_size, int world_size) {
  const Side in{shape.words, c.host_memory ? "staging" : shape.one_buffer() ? "" : "input"};
  const Side out{shape.words, "output"};
  RETURN_IF_ERROR(CheckOwned(in, owns_in, *c.in));
  if (!shape.one_buffer() && !c.host_memory) {
    RETURN_IF_ERROR(CheckOwned(out, owns_out, *c.out));
    if (c.in == c.out) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape.words, ": input and output are the same buffer"));
    }
  }
  if (c.matmul != nullptr) return CheckMatmul(c, shape, local_world_size);
  if (c.kind == CollectiveOp::kAllReduceCoalesced) {
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      const CoalescedTensor& t = c.tensors[i];
      RETURN_IF_ERROR(kernels::CheckCollectiveType(t.dtype));
      RETURN_IF_ERROR(CheckFits(in, static_cast<long>(i), *c.in, t.offset, t.count, t.dtype));
    }
    return absl::OkStatus();
  }
  if (!shape.typed()) return absl::OkStatus();
  const size_t n = static_cast<size_t>(world_size);
  const size_t in_count = shape.wide_in() ? n : 1, out_count = shape.wide_out() ? n : 1;
  const size_t factor = std::max(in_count, out_count);
  if (c.count > SIZE_MAX / factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        shape.words, ": count ", c.count, " too large (allowed: at most ", SIZE_MAX / factor, ")"));
  }
  if (c.host_memory) {
    return CheckHostMemory(c, shape, in_count, out_count, local_world_size,
                           world_size > local_world_size);
  }
  RETURN_IF_ERROR(CheckFits(in, -1, *c.in, 0, c.count * in_count, c.dtype));
  if (shape.one_buffer()) return absl::OkStatus();
  return CheckFits(out, -1, *c.out, 0, c.count * out_count, c.dtype);
}

absl::Status CheckCall(const CollectiveCall& c, bool owns_in, bool owns_out, int local_world_size,
                       int world_size) {
  const Shape& shape = ShapeOf(c.kind);
  RETURN_IF_ERROR(CheckOptions(*c.options));
  if (shape.typed() && c.kind != CollectiveOp::kAllReduceCoalesced) {
    RETURN_IF_ERROR(kernels::CheckCollectiveType(c.dtype));
  }
  if (shape.reduces()) RETURN_IF_ERROR(kernels::CheckReduceOp(c.op));
  if (shape.rooted() && (c.root < 0 || c.root >= world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": root ", c.root, " is out of range [0, ", world_size - 1, "]"));
  }
  return CheckBuffers(c, shape, owns_in, owns_out, local_world_size, world_size);
}

// The all-reduce algorithm by the group's one-shot threshold from the daemon's config
// (collectives.one_shot_max_read_bytes). A coalesced call splits every tensor into
// world-size chunks: its smallest tensor decides whether two-shot has empty chunks.
// `node_host`: a host group on this node alone, where ranks that outnumber the CPUs change
// the choice (a spanning group's nodes must choose alike whatever their CPUs).
kernels::Algorithm Choose(const CollectiveCall& c, const v1::CollectiveSettings& settings,
                          int world_size, bool node_host) {
  size_t bytes = c.count * ElementSize(c.dtype), min_count = c.count;
  if (c.kind == CollectiveOp::kAllReduceCoalesced) {
    bytes = 0;
    min_count = c.tensors.empty() ? 0 : SIZE_MAX;
    for (const CoalescedTensor& t : c.tensors) {
      bytes += t.count * ElementSize(t.dtype);
      if (t.count > 0) min_count = std::min(min_count, t.count);
    }
  }
  const kernels::AllReduceThresholds thresholds{
      .one_shot_max_read_bytes = static_cast<size_t>(settings.one_shot_max_read_bytes()),
      .oversubscribed_one_shot_max_bytes =
          node_host ? kernels::OversubscribedOneShotMaxBytes(world_size) : 0};
  return kernels::ChooseAllReduceAlgorithm(bytes, min_count, world_size, thresholds);
}

// DATA_LOSS for a NaN/Inf finding under policy FAIL (the same on every rank but for the
// local count).
absl::Status NanFailure(CollectiveOp op, const RecordId& id, const kernels::CollectiveResult& r) {
  return absl::DataLossError(absl::StrCat(
      RecordOpTorchName(static_cast<uint32_t>(op)), " seq ", id.collective_seq_id,
      ": NaN/Inf in the input of ", r.nonfinite_ranks, " rank(s), the first rank ",
      r.first_nonfinite_rank, " (", r.group_nonfinite_count, " value(s) over the group, ",
      r.nonfinite_count, " here); the group's nan policy is FAIL"));
}

}  // namespace

kernels::NanCheck ResolveNanCheck(const CollectiveOptions& o, const v1::CollectiveSettings& group,
                                  uint64_t seq) {
  using N = CollectiveOptions::NanCheck;
  N mode = o.nan_check;
  uint32_t period = o.nan_sample_period;
  if (mode == N::kDefault) {
    mode = group.nan_check() == v1::NAN_CHECK_ON        ? N::kOn
           : group.nan_check() == v1::NAN_CHECK_SAMPLED ? N::kSampled
                                                        : N::kOff;
    period = group.nan_sample_period();
  }
  const bool on = mode == N::kOn || (mode == N::kSampled && period > 0 && seq % period == 0);
  return on ? kernels::NanCheck::kOn : kernels::NanCheck::kOff;
}

void EntryTensors::Fill(const CollectiveCall& call, int64_t world) {
  const auto count = static_cast<int64_t>(call.count);
  const Shape& shape = ShapeOf(call.kind);
  const DataType dtype = call.dtype;
  n_in_ = n_out_ = 0;
  if (call.kind == CollectiveOp::kAllReduceCoalesced) {
    // The ring keeps kRecordMaxTensors a side; the rest are not recorded anyway.
    n_in_ = n_out_ = std::min<size_t>(call.tensors.size(), kRecordMaxTensors);
    for (size_t i = 0; i < n_in_; ++i) {
      dims_[i] = static_cast<int64_t>(call.tensors[i].count);
      in_.t[i] = out_.t[i] = TensorDesc{&dims_[i], 1, call.tensors[i].dtype};
    }
  } else if (call.matmul != nullptr) {
    // A's [rows, k] into the (first) output's [rows, n].
    const MatmulCall& m = *call.matmul;
    const auto rows = static_cast<int64_t>(m.rows);
    const bool gather = call.kind == CollectiveOp::kAllGatherMatmul;
    dims_[0] = rows;
    dims_[1] = static_cast<int64_t>(m.k);
    dims_[2] = gather ? rows * world : rows / world;
    dims_[3] = static_cast<int64_t>(m.bs[0].n);
    in_.t[0] = TensorDesc{&dims_[0], 2, dtype};
    out_.t[0] = TensorDesc{&dims_[2], 2, dtype};
    n_in_ = n_out_ = 1;
  } else if (shape.typed()) {
    dims_[0] = shape.wide_in() ? count * world : count;
    dims_[1] = shape.wide_out() ? count * world : count;
    in_.t[0] = TensorDesc{&dims_[0], 1, dtype};
    out_.t[0] = TensorDesc{&dims_[1], 1, dtype};
    n_in_ = n_out_ = 1;
  }
}

RecordArgs EntryTensors::Args(CollectiveOp kind, uint64_t timeout_ms) const {
  return {.op = ShapeOf(kind).recorded_as,
          .inputs = {in_.t, n_in_},
          .outputs = {out_.t, n_out_},
          .timeout_ms = timeout_ms};
}

CollectiveEntry::CollectiveEntry(const GroupParts& g, const CollectiveCall& call,
                                 const RecordShape* prepared)
    : g_(g), call_(call), shape_(prepared) {
  if (const std::optional<RecordId>& outer = call_.options->part_of; outer.has_value()) {
    // A part: the outer entry is the call's, and its seq decides the sampled NaN check, so
    // that every part of one collective is checked alike on every rank.
    part_ = true;
    handle_ = Recorder::Impl::Handle(*outer);
    nan_ = ResolveNanCheck(*call_.options, g_.settings, outer->collective_seq_id);
    return;
  }
  if (shape_ == nullptr) {
    own_tensors_.Fill(call, g.group.global_world_size());
    shape_ = &own_shape_.emplace(RecordShape{.args = own_tensors_.Args(call.kind, g.timeout_ms)});
  }
  nan_ = ResolveNanCheck(*call_.options, g_.settings,
                         g_.recorder.writer->NextCollectiveSeq(shape_->args));
}

void CollectiveEntry::Began(const RecordHandle& h) {
  handle_ = h;
  begun_ = true;
}

// Straight to the group's ring writer: what Recorder::Begin does, without converting the
// public tensor descriptors.
void CollectiveEntry::Begin() {
  if (!BeganAsPart()) Began(g_.recorder.writer->BeginPrepared(*shape_));
}
void CollectiveEntry::BeginStarted() {
  if (!BeganAsPart()) Began(g_.recorder.writer->BeginStartedPrepared(*shape_));
}

// A part's outer entry was begun by hand: the part only marks the rank alive, which the
// watchdog reads as progress while the one entry stays pending over many parts.
bool CollectiveEntry::BeganAsPart() {
  if (!part_) return false;
  g_.recorder.writer->Heartbeat();
  begun_ = true;
  return true;
}

absl::Status CollectiveEntry::StartedOnStream(void* cuda_stream) {
  if (part_) return absl::OkStatus();  // marked alive when it began
  return recorder().Started(id(), cuda_stream);
}

absl::Status CollectiveEntry::CompletedOnStream(void* cuda_stream) {
  if (part_) {
    g_.recorder.writer->Heartbeat();
    return absl::OkStatus();
  }
  return recorder().Completed(id(), cuda_stream);
}

void CollectiveEntry::Abandon() {
  if (part_) {
    g_.recorder.writer->Heartbeat();
  } else {
    g_.recorder.writer->Abandon(handle_);
  }
}

// Says why a wait failed: the daemon's abort reason, or a peer that exited.
absl::Status CollectiveEntry::Explain(absl::Status status) const {
  Group& group = g_.group;
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    if (group.abort_requested()) {
      // Aborted while this rank gave up waiting: the abort says why, the deadline does not.
      status = absl::AbortedError(status.message());
    } else if (const std::string gone = g_.peers.Exited(); !gone.empty()) {
      // The kernels see only signals that never came; a peer that exited will never send them.
      status = absl::DeadlineExceededError(
          absl::StrCat("group ", group.name(), ": ", gone, " (", status.message(), ")"));
    }
  }
  if (status.code() == absl::StatusCode::kAborted && group.abort_requested()) {
    // The kernels know only the abort word's code; the daemon's text says why.
    status = GroupAbortedError(group.name(), group.abort_reason(), status.message());
  }
  return status;
}

// Failures (a wait, a call mismatch, NaN under policy FAIL) retire the entry as abandoned,
// not completed: a mismatch stays visible to the watchdog at that seq.
absl::Status CollectiveEntry::FinishAny(absl::Status status,
                                        const kernels::CollectiveResult& result) {
  RingWriter& ring = *g_.recorder.writer;
  if (status.ok() && nan_ == kernels::NanCheck::kOn) {
    ring.NanChecked(handle_, result.nonfinite_count > 0);
  }
  if (status.ok() && result.nonfinite_ranks > 0 &&
      g_.settings.nan_policy() == v1::NAN_POLICY_FAIL) {
    status = NanFailure(ShapeOf(call_.kind).recorded, id(), result);
  }
  if (!status.ok()) status = Explain(std::move(status));
  if (status.ok() && !part_) {
    ring.Completed(handle_);
  } else {
    Abandon();  // a part leaves the outer entry to the caller: it only counts as life
  }
  SetOutputs(result);
  return status;
}

namespace {
// CollectiveOptions::part_of names a pending entry of this group's recorder.
[[gnu::noinline]] absl::Status CheckPartOf(const RecordId& id, const RingWriter& ring,
                                           const std::string& group, const Shape& shape) {
  if (ring.Pending(Recorder::Impl::Handle(id)) && id.collective_seq_id != 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      shape.words, ": part_of record ", id.record_id, " (collective seq ", id.collective_seq_id,
      ") is not a pending collective entry of group ", group,
      "'s recorder (allowed: an id Recorder::Begin of this group returned for a collective, "
      "not yet completed or abandoned, and still in the ring)"));
}
}  // namespace

absl::Status Group::Run(const CollectiveCall& c) {
  State& s = *state_;
  const bool spans = s.global_world_size > s.world_size;
  // A call on one buffer of this group's equal to the last one checked on it resolves as
  // that one did, and records the entry prepared with it. The owner is compared first (as
  // Group::owns: fields fixed at allocation), so only the owning group's calls, one thread at
  // a time, read or write the prepared call.
  SymmetricBuffer::State& in = *c.in->state_;
  const bool one_buffer = c.in == c.out && c.matmul == nullptr &&
                          c.kind != CollectiveOp::kAllReduceCoalesced &&
                          in.group_id == s.joined.group_id() && in.rank == s.joined.rank();
  const CheckedKey key{.valid = true,
                       .kind = c.kind,
                       .count = c.count,
                       .dtype = c.dtype,
                       .op = c.op,
                       .root = c.root,
                       .host_memory = c.host_memory,
                       .input = c.input,
                       .output = c.output};
  PreparedCall& prepared = in.prepared;
  kernels::Algorithm algorithm = kernels::Algorithm::kTwoShot;
  if (c.options->part_of.has_value()) {
    RETURN_IF_ERROR(
        CheckPartOf(*c.options->part_of, *s.entry_parts->recorder.writer, name(), ShapeOf(c.kind)));
  }
  if (one_buffer && prepared.key == key) {
    if (!OptionsValid(*c.options)) return OptionsError(*c.options);
    algorithm = prepared.algorithm;
  } else {
    if (c.host_memory && !device().is_host()) {
      return absl::InvalidArgumentError(absl::StrCat(
          ShapeOf(c.kind).words, " on host memory: group ", name(), " is on ", device().ToString(),
          "; the overloads taking pointers and a staging buffer need a host group (device memory "
          "takes the SymmetricBuffer overloads)"));
    }
    RETURN_IF_ERROR(CheckCall(c, owns(*c.in), owns(*c.out), s.world_size, s.global_world_size));
    if (s.backend == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          ShapeOf(c.kind).words, " buffer ", c.in->id(), " is on ", c.in->device().ToString(),
          "; this SDK was built without CUDA (COMMD_CUDA=OFF or no nvcc), so it runs "
          "collectives on host buffers only"));
    }
    if (c.kind == CollectiveOp::kAllReduce || c.kind == CollectiveOp::kAllReduceCoalesced) {
      algorithm = Choose(c, s.joined.collectives(), s.world_size, device().is_host() && !spans);
    }
    if (one_buffer) {
      prepared.key = key;
      prepared.kernel_ready = false;
      prepared.algorithm = algorithm;
      prepared.tensors.Fill(c, s.global_world_size);
      prepared.shape = RingWriter::Prepare(prepared.tensors.Args(c.kind, s.timeout_ms));
    }
  }
  // A spanning group's words (span_collectives.h): allocated by every rank's first collective,
  // in host memory whatever the group's device (the CPUs agree through them).
  if (spans && s.span_words == nullptr) {
    ASSIGN_OR_RETURN(s.span_words, AllocateSymmetricOn(kSpanWordsBytes, true));
  }
  const CheckedCall checked{
      .call = c,
      .views = in.views,
      .out_views = &c.out->state_->views,
      .span_words = spans ? &s.span_words->state_->views : nullptr,
      .algorithm = algorithm,
      .prepared = one_buffer ? &prepared : nullptr,
      .wait = c.options->timeout > absl::ZeroDuration() ? c.options->timeout : s.default_wait};
  CollectiveEntry entry(*s.entry_parts, c, one_buffer ? &prepared.shape : nullptr);
  return s.backend->Run(checked, entry);
}

absl::Status Group::Barrier() {
  if (abort_requested()) return GroupAbortedError(name(), abort_reason());
  // The barrier needs only a buffer's signal pads: the group allocates a small one on its
  // first barrier (every rank does, since every rank calls Barrier).
  if (barrier_buffer_ == nullptr) {
    ASSIGN_OR_RETURN(barrier_buffer_, AllocateSymmetric(64));
  }
  // Nothing to check; CUDA: the legacy default stream.
  static const CollectiveOptions kNoData{.nan_check = CollectiveOptions::NanCheck::kOff};
  return Run({.kind = CollectiveOp::kBarrier,
              .in = barrier_buffer_.get(),
              .out = barrier_buffer_.get(),
              .options = &kNoData});
}

absl::Status Group::AllReduce(SymmetricBuffer& buf, size_t count, DataType dtype, ReduceOp op,
                              const CollectiveOptions& options) {
  return Run({.kind = CollectiveOp::kAllReduce,
              .in = &buf,
              .out = &buf,
              .count = count,
              .dtype = dtype,
              .op = op,
              .options = &options});
}

absl::Status Group::AllReduceCoalesced(SymmetricBuffer& buf,
                                       const std::vector<CoalescedTensor>& tensors, ReduceOp op,
                                       const CollectiveOptions& options) {
  return Run({.kind = CollectiveOp::kAllReduceCoalesced,
              .in = &buf,
              .out = &buf,
              .op = op,
              .tensors = tensors,
              .options = &options});
}

absl::Status Group::AllGather(SymmetricBuffer& in, SymmetricBuffer& out, size_t count,
                              DataType dtype, const CollectiveOptions& options) {
  return Run({.kind = CollectiveOp::kAllGather,
              .in = &in,
              .out = &out,
              .count = count,
              .dtype = dtype,
              .options = &options});
}

absl::Status Group::ReduceScatter(SymmetricBuffer& in, SymmetricBuffer& out, size_t count,
                                  DataType dtype, ReduceOp op, const CollectiveOptions& options) {
  return Run({.kind = CollectiveOp::kReduceScatter,
              .in = &in,
              .out = &out,
              .count = count,
              .dtype = dtype,
              .op = op,
              .options = &options});
}

absl::Status Group::Broadcast(SymmetricBuffer& buf, size_t count, DataType dtype, int root,
                              const CollectiveOptions& options) {
  return Run({.kind = CollectiveOp::kBroadcast,
              .in = &buf,
              .out = &buf,
              .count = count,
              .dtype = dtype,
              .root = root,
              .options = &options});
}

absl::Status Group::AllToAll(SymmetricBuffer& in, SymmetricBuffer& out, size_t count,
                             DataType dtype, const CollectiveOptions& options) {
  return Run({.kind = CollectiveOp::kAllToAll,
              .in = &in,
              .out = &out,
              .count = count,
              .dtype = dtype,
              .options = &options});
}

absl::Status Group::AllGatherMatmul(SymmetricBuffer& a, size_t rows, size_t k, DataType dtype,
                                    const std::vector<MatmulB>& bs, const float* row_scale,
                                    void* gathered, const CollectiveOptions& options) {
  const MatmulCall m{.rows = rows, .k = k, .bs = bs, .row_scale = row_scale, .gathered = gathered};
  return Run({.kind = CollectiveOp::kAllGatherMatmul,
              .in = &a,
              .out = &a,
              .count = rows * k,
              .dtype = dtype,
              .options = &options,
              .matmul = &m});
}

absl::Status Group::MatmulReduceScatter(const void* a, size_t rows, size_t k, DataType dtype,
                                        const MatmulB& b, ReduceOp op, SymmetricBuffer& workspace,
                                        const float* row_scale, const CollectiveOptions& options) {
  const MatmulCall m{.rows = rows, .k = k, .bs = {&b, 1}, .row_scale = row_scale, .a = a};
  return Run({.kind = CollectiveOp::kMatmulReduceScatter,
              .in = &workspace,
              .out = &workspace,
              .count = rows * b.n,
              .dtype = dtype,
              .op = op,
              .options = &options,
              .matmul = &m});
}

// The host-memory overloads: the same funnel, with the staging buffer as the call's buffer.
namespace {
CollectiveCall OnHostMemory(CollectiveOp kind, const void* input, void* output, size_t count,
                            DataType dtype, SymmetricBuffer& staging,
                            const CollectiveOptions& options) {
  return {.kind = kind,
          .in = &staging,
          .out = &staging,
          .count = count,
          .dtype = dtype,
          .host_memory = true,
          .input = input,
          .output = output,
          .options = &options};
}
}  // namespace

absl::Status Group::AllReduce(const void* input, void* output, size_t count, DataType dtype,
                              ReduceOp op, SymmetricBuffer& staging,
                              const CollectiveOptions& options) {
  CollectiveCall call =
      OnHostMemory(CollectiveOp::kAllReduce, input, output, count, dtype, staging, options);
  call.op = op;
  return Run(call);
}

absl::Status Group::AllGather(const void* input, void* output, size_t count, DataType dtype,
                              SymmetricBuffer& staging, const CollectiveOptions& options) {
  return Run(OnHostMemory(CollectiveOp::kAllGather, input, output, count, dtype, staging, options));
}

absl::Status Group::ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                                  ReduceOp op, SymmetricBuffer& staging,
                                  const CollectiveOptions& options) {
  CollectiveCall call =
      OnHostMemory(CollectiveOp::kReduceScatter, input, output, count, dtype, staging, options);
  call.op = op;
  return Run(call);
}

absl::Status Group::Broadcast(void* buffer, size_t count, DataType dtype, int root,
                              SymmetricBuffer& staging, const CollectiveOptions& options) {
  CollectiveCall call =
      OnHostMemory(CollectiveOp::kBroadcast, buffer, buffer, count, dtype, staging, options);
  call.root = root;
  return Run(call);
}

absl::Status Group::AllToAll(const void* input, void* output, size_t count, DataType dtype,
                             SymmetricBuffer& staging, const CollectiveOptions& options) {
  return Run(OnHostMemory(CollectiveOp::kAllToAll, input, output, count, dtype, staging, options));
}

}  // namespace commd
