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
#include "client/src/collective_checks.h"
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

// The all-reduce algorithm by the group's one-shot threshold from the daemon's config
// (collectives.one_shot_max_read_bytes). A coalesced call splits every tensor into
// world-size chunks: its smallest tensor decides whether two-shot has empty chunks.
// `node_host`: a host group on this node alone, where ranks that outnumber the CPUs change
// the choice (a spanning group's nodes must choose alike whatever their CPUs).
kernels::Algorithm Choose(const CollectiveCall& c, const v1::CollectiveSettings& settings,
                          int world_size, bool node_host) {
  size_t bytes = c.count * DataTypeSize(c.dtype), min_count = c.count;
  if (c.kind == CollectiveOp::kAllReduceCoalesced) {
    bytes = 0;
    min_count = c.tensors.empty() ? 0 : SIZE_MAX;
    for (const CoalescedTensor& t : c.tensors) {
      bytes += t.count * DataTypeSize(t.dtype);
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
  return absl::DataLossError(
      absl::StrCat(CollectiveName(op), " seq ", id.collective_seq_id, ": NaN/Inf in the input of ",
                   r.nonfinite_ranks, " rank(s), the first rank ", r.first_nonfinite_rank, " (",
                   r.group_nonfinite_count, " value(s) over the group, ", r.nonfinite_count,
                   " here); the group's nan policy is FAIL"));
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
    status = NanFailure(ShapeOf(call_.kind).recorded_as, id(), result);
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
