// Group's collectives: a HostCommView over the group's symmetric buffers, the control block's
// abort word and the group's timeout, run by kernels/host and recorded in the flight recorder,
// with the group's settings from the daemon (JoinGroupResponse.collectives): the one-shot
// threshold, the NaN/Inf check and the NaN policy. CUDA buffers take the same argument
// checks here and are enqueued by cuda_collectives.cc (only in builds with CUDA).
#include "kernels/host/collectives.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/src/cuda_collectives.h"
#include "client/src/group_state.h"
#include "commd/group.h"
#include "common/control_block.h"
#include "common/status_macros.h"
#include "kernels/algorithm.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd {
namespace {

constexpr uint32_t kMaxSamplePeriod = 1000000;

// The pointers a HostCommView borrows, for one buffer.
struct ViewStorage {
  std::vector<std::byte*> data;
  std::vector<uint32_t*> pads;
  kernels::HostCommView view;
};

// How long this rank waits for its peers. The watchdog diagnoses (and under notify aborts) a
// collective pending past the group's timeout; the SDK's own limit is a backstop for when the
// daemon cannot act, so by default it comes later.
absl::Duration WaitLimit(absl::Duration group_timeout, const CollectiveOptions& options) {
  return options.timeout > absl::ZeroDuration() ? options.timeout : 2 * group_timeout;
}

void MakeView(Group& group, SymmetricBuffer& buf, absl::Duration wait, ViewStorage* s) {
  const int n = group.world_size();
  s->data.resize(n);
  s->pads.resize(n);
  for (int p = 0; p < n; ++p) {
    s->data[p] = static_cast<std::byte*>(buf.peer(p));
    s->pads[p] = buf.signal_pad(p);
  }
  auto* block = static_cast<std::byte*>(group.control_block());
  const uint32_t* abort_word = nullptr;
  uint64_t* heartbeat = nullptr;
  if (group.control_block_bytes() >= sizeof(ControlBlockFixed)) {
    abort_word = reinterpret_cast<const uint32_t*>(block + kAbortOffset);
    heartbeat = reinterpret_cast<uint64_t*>(block + kProgressOffset +
                                            offsetof(ControlBlockProgress, heartbeat_ns));
  }
  s->view = kernels::HostCommView{.rank = group.rank(),
                                  .world_size = n,
                                  .data = s->data.data(),
                                  .pads = s->pads.data(),
                                  .data_bytes = buf.size(),
                                  .pad_slots = buf.signal_pad_bytes() / sizeof(uint32_t),
                                  .abort_word = abort_word,
                                  .deadline = absl::Now() + wait,
                                  .heartbeat_ns = heartbeat};
}

absl::Status CheckOptions(const CollectiveOptions& o) {
  if (o.nan_check != CollectiveOptions::NanCheck::kOff &&
      o.nan_check != CollectiveOptions::NanCheck::kOn &&
      o.nan_check != CollectiveOptions::NanCheck::kSampled &&
      o.nan_check != CollectiveOptions::NanCheck::kDefault) {
    return absl::InvalidArgumentError(
        absl::StrCat("nan_check ", static_cast<int>(o.nan_check),
                     " is not one of off (0), on (1), sampled (2), default (3)"));
  }
  if (o.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(o.timeout),
                     " is negative (allowed: > 0, or 0 for twice the group's timeout)"));
  }
  if (o.nan_check == CollectiveOptions::NanCheck::kSampled &&
      (o.nan_sample_period < 1 || o.nan_sample_period > kMaxSamplePeriod)) {
    return absl::InvalidArgumentError(absl::StrCat("nan_sample_period ", o.nan_sample_period,
                                                   " is out of range [1, ", kMaxSamplePeriod, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckType(DataType dtype) {
  if (!kernels::IsValid(static_cast<kernels::DataType>(dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("data type ", static_cast<int>(dtype), " is out of range [0, 4]"));
  }
  return absl::OkStatus();
}

absl::Status CheckOp(ReduceOp op) {
  if (!kernels::IsValid(static_cast<kernels::ReduceOp>(op))) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", static_cast<int>(op), " is out of range [0, 3]"));
  }
  return absl::OkStatus();
}

// `elements` of `dtype` must fit `buf`'s data bytes.
absl::Status CheckFits(const char* what, const SymmetricBuffer& buf, size_t offset, size_t elements,
                       DataType dtype) {
  const size_t es = kernels::DataTypeSize(static_cast<kernels::DataType>(dtype));
  const size_t size = buf.size();
  if (offset > size || elements > (size - offset) / es) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", elements, " elements of ", es, " bytes at offset ", offset,
                     " do not fit the buffer's ", size, " bytes (allowed: at most ",
                     offset > size ? 0 : (size - offset) / es, " elements)"));
  }
  if (offset % es != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": offset ", offset, " is not a multiple of the element size ", es));
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(const char* what, bool owned, const SymmetricBuffer& buf) {
  if (!owned) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " buffer ", buf.id(), " was not allocated by this group for this rank"));
  }
#ifndef COMMD_HAVE_CUDA
  if (!buf.device().is_host()) {
    return absl::UnimplementedError(
        absl::StrCat(what, " buffer ", buf.id(), " is on ", buf.device().ToString(),
                     "; this SDK was built without CUDA (COMMD_CUDA=OFF or no nvcc), so it runs "
                     "collectives on host buffers only"));
  }
#endif
  return absl::OkStatus();
}

// What the collectives need of the group's state (Group::State is private to Group).
struct GroupCollectives {
  const v1::CollectiveSettings& settings;
  Recorder::Impl& recorder;
  const PeerProcesses& peers;
};

const char* OpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    default:
      return "barrier";
  }
}

// DATA_LOSS for a NaN/Inf finding under policy FAIL (the same on every rank but for the
// local count).
absl::Status NanFailure(CollectiveOp op, const RecordId& id, const kernels::CollectiveResult& r) {
  return absl::DataLossError(absl::StrCat(
      OpName(op), " seq ", id.collective_seq_id, ": NaN/Inf in the input of ", r.nonfinite_ranks,
      " rank(s), the first rank ", r.first_nonfinite_rank, " (", r.group_nonfinite_count,
      " value(s) over the group, ", r.nonfinite_count, " here); the group's nan policy is FAIL"));
}

// A collective with distinct input and output buffers: both this group's, not the same one,
// the input holding count x in_factor elements and the output count x out_factor
// (all-gather: 1 and the world size; reduce-scatter: the world size and 1).
absl::Status CheckInOut(const char* name, bool owns_in, const SymmetricBuffer& in, bool owns_out,
                        const SymmetricBuffer& out, size_t count, size_t in_factor,
                        size_t out_factor, DataType dtype) {
  const std::string what_in = absl::StrCat(name, " input");
  const std::string what_out = absl::StrCat(name, " output");
  RETURN_IF_ERROR(CheckBuffer(what_in.c_str(), owns_in, in));
  RETURN_IF_ERROR(CheckBuffer(what_out.c_str(), owns_out, out));
  if (&in == &out) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": input and output are the same buffer"));
  }
  const size_t factor = std::max(in_factor, out_factor);
  if (count > SIZE_MAX / factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": count ", count, " too large (allowed: at most ", SIZE_MAX / factor, ")"));
  }
  RETURN_IF_ERROR(CheckFits(what_in.c_str(), in, 0, count * in_factor, dtype));
  return CheckFits(what_out.c_str(), out, 0, count * out_factor, dtype);
}

// Runs `body` between the recorder's transitions and applies the group's NaN policy. Failures
// (a wait, a call mismatch, NaN under policy FAIL) retire the entry as abandoned, not
// completed: a mismatch stays visible to the watchdog at that seq.
template <typename Body>
absl::Status Recorded(Group& group, const GroupCollectives& gc, CollectiveOp op,
                      const std::vector<TensorDesc>& in, const std::vector<TensorDesc>& out,
                      absl::Duration timeout, const CollectiveOptions& options, Body body) {
  Recorder& rec = group.recorder();
  const RecordId id = rec.Begin(op, in, out, -1, absl::ToInt64Milliseconds(timeout));
  const v1::CollectiveSettings& settings = gc.settings;
  const kernels::NanCheck nan = ResolveNanCheck(options, settings, id.collective_seq_id);
  kernels::CollectiveResult result;
  rec.Started(id);
  absl::Status status = body(nan, &result);
  if (status.ok() && nan == kernels::NanCheck::kOn) {
    gc.recorder.NanChecked(id, result.nonfinite_count > 0);
  }
  if (status.ok() && result.nonfinite_ranks > 0 && settings.nan_policy() == v1::NAN_POLICY_FAIL) {
    status = NanFailure(op, id, result);
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    if (group.abort_requested()) {
      // Aborted while this rank gave up waiting: the abort says why, the deadline does not.
      status = absl::AbortedError(status.message());
    } else if (const std::string gone = gc.peers.Exited(); !gone.empty()) {
      // The kernels see only signals that never came; a peer that exited will never send them.
      status = absl::DeadlineExceededError(
          absl::StrCat("group ", group.name(), ": ", gone, " (", status.message(), ")"));
    }
  }
  if (status.code() == absl::StatusCode::kAborted && group.abort_requested()) {
    // The kernels know only the abort word's code; the daemon's text says why.
    status = absl::AbortedError(absl::StrCat("group ", group.name(), " aborted ",
                                             group.abort_reason(), " (", status.message(), ")"));
  }
  if (status.ok()) {
    rec.Completed(id);
  } else {
    rec.Abandoned(id);
  }
  if (options.nonfinite_count != nullptr) *options.nonfinite_count = result.nonfinite_count;
  if (options.nonfinite_ranks != nullptr) *options.nonfinite_ranks = result.nonfinite_ranks;
  return status;
}

// Dims storage for TensorDesc (which borrows its dims).
struct Descs {
  std::vector<int64_t> dims;
  std::vector<TensorDesc> descs;
  Descs(std::initializer_list<std::pair<size_t, DataType>> tensors) {
    dims.reserve(tensors.size());
    for (const auto& [n, t] : tensors) {
      dims.push_back(static_cast<int64_t>(n));
      descs.push_back(TensorDesc{&dims.back(), 1, t});
    }
  }
};

// The group's one-shot threshold from the daemon's config (collectives.one_shot_max_read_bytes).
kernels::Algorithm Choose(const v1::CollectiveSettings& settings, size_t bytes, size_t count,
                          int world_size) {
  const kernels::AllReduceThresholds thresholds{
      .one_shot_max_read_bytes = static_cast<size_t>(settings.one_shot_max_read_bytes())};
  return kernels::ChooseAllReduceAlgorithm(bytes, count, world_size, thresholds);
}

}  // namespace

// Whether collective `seq` checks its input: the call's choice, else the group's (declared in
// cuda_collectives.h, which uses it too).
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

absl::Status Group::Barrier() {
  if (abort_requested())
    return absl::AbortedError(absl::StrCat("group ", name(), " aborted ", abort_reason()));
  // kernels::Barrier needs only a buffer's signal pads: the group allocates a small one on
  // its first barrier (every rank does, since every rank calls Barrier).
  if (barrier_buffer_ == nullptr) {
    auto buf = AllocateSymmetric(64);
    if (!buf.ok()) return buf.status();
    barrier_buffer_ = std::move(*buf);
  }
#ifdef COMMD_HAVE_CUDA
  if (!barrier_buffer_->device().is_host()) {
    const CollectiveOptions no_data;  // the legacy default stream
    return RunCudaCollective(state_->Cuda(*this, WaitLimit(collective_timeout(), no_data)),
                             {.view_buffer = barrier_buffer_.get()}, no_data);
  }
#endif
  ViewStorage s;
  MakeView(*this, *barrier_buffer_, WaitLimit(collective_timeout(), {}), &s);
  CollectiveOptions no_data;  // nothing to check
  no_data.nan_check = CollectiveOptions::NanCheck::kOff;
  return Recorded(
      *this, {state_->joined.collectives(), *state_->recorder_impl, state_->peers},
      CollectiveOp::kBarrier, {}, {}, collective_timeout(), no_data,
      [&](kernels::NanCheck, kernels::CollectiveResult*) { return kernels::Barrier(s.view); });
}

absl::Status Group::AllReduce(SymmetricBuffer& buf, size_t count, DataType dtype, ReduceOp op,
                              const CollectiveOptions& options) {
  if (auto st = CheckOptions(options); !st.ok()) return st;
  if (auto st = CheckType(dtype); !st.ok()) return st;
  if (auto st = CheckOp(op); !st.ok()) return st;
  if (auto st = CheckBuffer("all-reduce", owns(buf), buf); !st.ok()) return st;
  if (auto st = CheckFits("all-reduce", buf, 0, count, dtype); !st.ok()) return st;
  Descs d{{count, dtype}};
  const kernels::Algorithm algorithm = Choose(
      state_->joined.collectives(),
      count * kernels::DataTypeSize(static_cast<kernels::DataType>(dtype)), count, world_size());
#ifdef COMMD_HAVE_CUDA
  if (!buf.device().is_host()) {
    return RunCudaCollective(state_->Cuda(*this, WaitLimit(collective_timeout(), options)),
                             {.kind = CudaKind::kAllReduce,
                              .record_op = CollectiveOp::kAllReduce,
                              .view_buffer = &buf,
                              .launches = {{buf.data(), buf.data(), count,
                                            static_cast<kernels::DataType>(dtype), algorithm}},
                              .op = static_cast<kernels::ReduceOp>(op),
                              .inputs = d.descs,
                              .outputs = d.descs},
                             options);
  }
#endif
  ViewStorage s;
  MakeView(*this, buf, WaitLimit(collective_timeout(), options), &s);
  return Recorded(*this, {state_->joined.collectives(), *state_->recorder_impl, state_->peers},
                  CollectiveOp::kAllReduce, d.descs, d.descs, collective_timeout(), options,
                  [&](kernels::NanCheck nan, kernels::CollectiveResult* r) {
                    return kernels::AllReduce(s.view, buf.data(), buf.data(), count,
                                              static_cast<kernels::DataType>(dtype),
                                              static_cast<kernels::ReduceOp>(op), algorithm, nan,
                                              r);
                  });
}

absl::Status Group::AllReduceCoalesced(SymmetricBuffer& buf,
                                       const std::vector<CoalescedTensor>& tensors, ReduceOp op,
                                       const CollectiveOptions& options) {
  if (auto st = CheckOptions(options); !st.ok()) return st;
  if (auto st = CheckOp(op); !st.ok()) return st;
  if (auto st = CheckBuffer("all-reduce", owns(buf), buf); !st.ok()) return st;
  std::vector<kernels::TensorArgs> args;
  std::vector<int64_t> dims(tensors.size());
  std::vector<TensorDesc> descs;
  size_t total = 0;
  size_t min_count = tensors.empty() ? 0 : SIZE_MAX;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CoalescedTensor& t = tensors[i];
    if (auto st = CheckType(t.dtype); !st.ok()) return st;
    const std::string what = absl::StrCat("all-reduce tensor ", i);
    if (auto st = CheckFits(what.c_str(), buf, t.offset, t.count, t.dtype); !st.ok()) return st;
    std::byte* p = static_cast<std::byte*>(buf.data()) + t.offset;
    args.push_back({p, p, t.count, static_cast<kernels::DataType>(t.dtype)});
    dims[i] = static_cast<int64_t>(t.count);
    descs.push_back(TensorDesc{&dims[i], 1, t.dtype});
    total += t.count * kernels::DataTypeSize(static_cast<kernels::DataType>(t.dtype));
    if (t.count > 0) min_count = std::min(min_count, t.count);
  }
  // Every tensor is split into world-size chunks: the smallest decides whether two-shot has
  // empty chunks.
  const kernels::Algorithm algorithm =
      Choose(state_->joined.collectives(), total, min_count, world_size());
#ifdef COMMD_HAVE_CUDA
  if (!buf.device().is_host()) {
    // The device kernels take one tensor a launch: one launch per tensor, one entry.
    CudaCollective c{.kind = CudaKind::kAllReduce,
                     .record_op = CollectiveOp::kAllReduce,
                     .view_buffer = &buf,
                     .op = static_cast<kernels::ReduceOp>(op),
                     .inputs = descs,
                     .outputs = descs};
    for (const kernels::TensorArgs& a : args) {
      c.launches.push_back({a.input, a.output, a.count, a.dtype, algorithm});
    }
    return RunCudaCollective(state_->Cuda(*this, WaitLimit(collective_timeout(), options)), c,
                             options);
  }
#endif
  ViewStorage s;
  MakeView(*this, buf, WaitLimit(collective_timeout(), options), &s);
  return Recorded(*this, {state_->joined.collectives(), *state_->recorder_impl, state_->peers},
                  CollectiveOp::kAllReduce, descs, descs, collective_timeout(), options,
                  [&](kernels::NanCheck nan, kernels::CollectiveResult* r) {
                    return kernels::AllReduceCoalesced(
                        s.view, args, static_cast<kernels::ReduceOp>(op), algorithm, nan, r);
                  });
}

absl::Status Group::AllGather(SymmetricBuffer& in, SymmetricBuffer& out, size_t count,
                              DataType dtype, const CollectiveOptions& options) {
  if (auto st = CheckOptions(options); !st.ok()) return st;
  if (auto st = CheckType(dtype); !st.ok()) return st;
  const size_t n = static_cast<size_t>(world_size());
  if (auto st = CheckInOut("all-gather", owns(in), in, owns(out), out, count, 1, n, dtype);
      !st.ok())
    return st;
  Descs d{{count, dtype}, {count * n, dtype}};
#ifdef COMMD_HAVE_CUDA
  if (!in.device().is_host()) {
    return RunCudaCollective(
        state_->Cuda(*this, WaitLimit(collective_timeout(), options)),
        {.kind = CudaKind::kAllGather,
         .record_op = CollectiveOp::kAllGather,
         .view_buffer = &in,
         .launches = {{in.data(), out.data(), count, static_cast<kernels::DataType>(dtype)}},
         .inputs = {d.descs.data(), 1},
         .outputs = {d.descs.data() + 1, 1}},
        options);
  }
#endif
  ViewStorage s;
  MakeView(*this, in, WaitLimit(collective_timeout(), options), &s);
  return Recorded(*this, {state_->joined.collectives(), *state_->recorder_impl, state_->peers},
                  CollectiveOp::kAllGather, {d.descs[0]}, {d.descs[1]}, collective_timeout(),
                  options, [&](kernels::NanCheck nan, kernels::CollectiveResult* r) {
                    return kernels::AllGather(s.view, in.data(), out.data(), count,
                                              static_cast<kernels::DataType>(dtype), nan, r);
                  });
}

absl::Status Group::ReduceScatter(SymmetricBuffer& in, SymmetricBuffer& out, size_t count,
                                  DataType dtype, ReduceOp op, const CollectiveOptions& options) {
  if (auto st = CheckOptions(options); !st.ok()) return st;
  if (auto st = CheckType(dtype); !st.ok()) return st;
  if (auto st = CheckOp(op); !st.ok()) return st;
  const size_t n = static_cast<size_t>(world_size());
  if (auto st = CheckInOut("reduce-scatter", owns(in), in, owns(out), out, count, n, 1, dtype);
      !st.ok())
    return st;
  Descs d{{count * n, dtype}, {count, dtype}};
#ifdef COMMD_HAVE_CUDA
  if (!in.device().is_host()) {
    return RunCudaCollective(
        state_->Cuda(*this, WaitLimit(collective_timeout(), options)),
        {.kind = CudaKind::kReduceScatter,
         .record_op = CollectiveOp::kReduceScatter,
         .view_buffer = &in,
         .launches = {{in.data(), out.data(), count, static_cast<kernels::DataType>(dtype)}},
         .op = static_cast<kernels::ReduceOp>(op),
         .inputs = {d.descs.data(), 1},
         .outputs = {d.descs.data() + 1, 1}},
        options);
  }
#endif
  ViewStorage s;
  MakeView(*this, in, WaitLimit(collective_timeout(), options), &s);
  return Recorded(*this, {state_->joined.collectives(), *state_->recorder_impl, state_->peers},
                  CollectiveOp::kReduceScatter, {d.descs[0]}, {d.descs[1]}, collective_timeout(),
                  options, [&](kernels::NanCheck nan, kernels::CollectiveResult* r) {
                    return kernels::ReduceScatter(s.view, in.data(), out.data(), count,
                                                  static_cast<kernels::DataType>(dtype),
                                                  static_cast<kernels::ReduceOp>(op), nan, r);
                  });
}

}  // namespace commd
