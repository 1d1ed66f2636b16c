#include "kernels/host/collectives.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "kernels/algorithm.h"
#include "kernels/host/barrier.h"
#include "kernels/host/call_check.h"
#include "kernels/host/element_loops.h"
#include "kernels/host/plan.h"

namespace commd::kernels {
namespace {

// Where a one-shot in-place all-reduce keeps its results until every peer has finished
// reading the inputs they replace. Per thread, reused across calls.
std::vector<std::byte>& Scratch() {
  thread_local std::vector<std::byte> scratch;
  return scratch;
}

// Data region pointers of every rank at `offset`, in rank order.
void Sources(const HostCommView& view, size_t offset, const std::byte** srcs) {
  for (int p = 0; p < view.world_size; ++p) srcs[p] = view.data[p] + offset;
}

uint64_t CopyInAll(const HostCommView& view, const StagingPlan& plan, NanCheck check) {
  uint64_t bad = 0;
  for (const StagedTensor& t : plan.tensors) {
    bad += CopyIn(t.dtype, t.input, view.data[view.rank] + t.offset, t.staged_count, check);
  }
  return bad;
}

// Where the tensors of a one-shot all-reduce small enough to travel in the exchange sit in
// the payload (each at a 16-byte boundary), and the bytes they take; 0 for no tensors.
size_t PayloadBytes(const StagingPlan& plan) {
  size_t at = 0;
  for (const StagedTensor& t : plan.tensors) at = AlignUp(at, 16) + t.count * t.element_size;
  return at;
}

// Whether this all-reduce's inputs travel in the exchange: a one-shot whose inputs fit one
// slot's payload. Every rank that makes the same call decides alike (the counts, types and
// algorithm are in the call hash; the world size is the view's).
bool Carries(const HostCommView& view, const StagingPlan& plan, const CallSignature& call) {
  return call.kind == CollectiveOp::kAllReduce && call.algorithm == Algorithm::kOneShot &&
         PayloadBytes(plan) <= HostExchange::PayloadCapacity(view.world_size);
}

// Where the tensors sit in the data regions, as one word of the call hash
// (CallSignature::staging).
uint64_t StagingDigest(const StagingPlan& plan) {
  uint64_t digest = plan.in_place ? 1 : 0;
  for (const StagedTensor& t : plan.tensors) digest = digest * 31 + t.offset;
  return digest;
}

// The op, then that it is defined on each tensor's type (float32 takes every valid op).
absl::Status CheckOp(CollectiveOp kind, ReduceOp op, absl::Span<const TensorArgs> tensors) {
  if (!IsValid(op)) {  // named once, before any tensor ("reduce op 9 is not one of ...")
    return absl::InvalidArgumentError(
        absl::StrCat(CollectiveName(kind), ": ", CheckReduceOp(op, DataType::kFloat32).message()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (absl::Status s = CheckReduceOp(op, tensors[i].dtype); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(CollectiveName(kind), " tensor ", i, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// The view must have been validated.
absl::Status CheckRoot(const HostCommView& view, int root) {
  if (root >= 0 && root < view.world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("broadcast: root ", root, " is out of range [0, ",
                                                 view.world_size - 1, "] (the group's ranks)"));
}

// Validates `call` against `view` as a collective's entry does (the caller has checked the
// op and the algorithm) and fills `out` with what its runs need. On error `out` matches no
// view, so it cannot be run.
absl::Status Prepare(const HostCommView& view, const CallSignature& call, PreparedCollective* out) {
  out->data = nullptr;
  absl::StatusOr<StagingPlan> plan = PlanCollective(view, call.kind, call.tensors);
  if (!plan.ok()) return plan.status();
  if (call.kind == CollectiveOp::kBroadcast) RETURN_IF_ERROR(CheckRoot(view, call.root));
  out->plan = *std::move(plan);
  CallSignature staged = call;
  staged.staging = StagingDigest(out->plan);
  out->words = MakeCallWords(staged, 0);
  out->carries = Carries(view, out->plan, call);
  out->kind = call.kind;
  out->op = call.op;
  out->algorithm = call.algorithm;
  out->root = call.root;
  out->pads = view.pads;
  out->rank = view.rank;
  out->world_size = view.world_size;
  out->data_bytes = view.data_bytes;
  out->pad_slots = view.pad_slots;
  out->data = view.data;  // last: now it matches its view
  return absl::OkStatus();
}

// Cold path of CheckPrepared.
ABSL_ATTRIBUTE_NOINLINE absl::Status NotPreparedFor(const HostCommView& view,
                                                    const PreparedCollective& p,
                                                    CollectiveOp kind) {
  if (p.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(CollectiveName(kind), " on rank ", view.rank,
                     ": the prepared call is not prepared (never, or its preparation failed)"));
  }
  if (p.kind != kind) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(kind), " on rank ", view.rank,
                                                   ": the prepared call is a ",
                                                   CollectiveName(p.kind)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(CollectiveName(kind), " on rank ", view.rank,
                   ": the prepared call was validated against another view (rank ", p.rank, " of ",
                   p.world_size, ", ", p.data_bytes, " data bytes, ", p.pad_slots,
                   " pad slots, other pointer "
                   "arrays or these differ); allowed: the view it was prepared with"));
}

// A prepared call runs only as the collective it was made for, on the view it was validated
// against; the result starts clean.
absl::Status CheckPrepared(const HostCommView& view, const PreparedCollective& p, CollectiveOp kind,
                           CollectiveResult* result) {
  if (!p.ViewMatches(view) || p.kind != kind) return NotPreparedFor(view, p, kind);
  if (result != nullptr) *result = CollectiveResult{};
  return absl::OkStatus();
}

// Copy-in (a broadcast stages the root's buffer only; carried inputs go into the exchange
// instead) and the exchange of every rank's call words, then the call check. The exchange is
// the staging barrier too: a rank sends after its copy-in. A mismatch fails every rank alike
// and leaves nothing to settle (the next exchange uses the other parity).
absl::Status Stage(HostExchange& x, const PreparedCollective& p, NanCheck check,
                   CollectiveResult* result) {
  const HostCommView& view = x.view();
  const StagingPlan& plan = p.plan;
  RETURN_IF_ERROR(CheckNotAborted(view, CollectiveName(p.kind)));
  uint64_t bad = 0;
  size_t payload = 0;
  if (p.carries) {
    for (const StagedTensor& t : plan.tensors) {
      payload = AlignUp(payload, 16);
      bad += CopyIn(t.dtype, t.input, x.own_payload() + payload, t.staged_count, check);
      payload += t.count * t.element_size;
    }
  } else if (p.kind != CollectiveOp::kBroadcast || view.rank == p.root) {
    bad = CopyInAll(view, plan, check);
  }
  if (result != nullptr) result->nonfinite_count = bad;
  x.Send(AddNonfinite(p.words, bad), payload);
  if (view.posted != nullptr) view.posted(view.posted_context);
  RETURN_IF_ERROR(x.WaitForAll());
  return CheckCalls(x, p.kind, result);
}

// One-shot on inputs that came in the exchange: each rank reduces every rank's copy in its
// own memory straight into its output. Nothing else to wait for: no rank reads another's
// region.
void ReduceCarried(const HostExchange& x, const StagingPlan& plan, ReduceOp op) {
  const int w = x.view().world_size;
  const std::byte* srcs[kMaxWorldSize];
  size_t at = 0;
  for (const StagedTensor& t : plan.tensors) {
    at = AlignUp(at, 16);
    for (int p = 0; p < w; ++p) srcs[p] = x.payload(p) + at;
    ReduceInto(t.dtype, op, srcs, w, 0, t.count, t.output, w);
    at += t.count * t.element_size;
  }
}

// One-shot on inputs staged in the data regions: every rank reduces all of them into scratch
// (or its output), and only after a barrier, once every peer has read its region, writes a
// result that replaces its input there.
absl::Status OneShot(const HostCommView& view, const StagingPlan& plan, ReduceOp op) {
  const absl::string_view name = CollectiveName(CollectiveOp::kAllReduce);
  const std::byte* srcs[kMaxWorldSize];
  std::vector<std::byte>& scratch = Scratch();
  size_t scratch_bytes = 0;
  for (const StagedTensor& t : plan.tensors) {
    if (t.in_place) scratch_bytes += t.count * t.element_size;
  }
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  size_t at = 0;
  for (const StagedTensor& t : plan.tensors) {
    Sources(view, t.offset, srcs);
    std::byte* dst = t.in_place ? scratch.data() + at : t.output;
    ReduceInto(t.dtype, op, srcs, view.world_size, 0, t.count, dst, view.world_size);
    if (t.in_place) at += t.count * t.element_size;
  }
  RETURN_IF_ERROR(HostBarrier(view, name));
  at = 0;
  for (const StagedTensor& t : plan.tensors) {
    if (!t.in_place) continue;
    std::memcpy(t.output, scratch.data() + at, t.count * t.element_size);
    at += t.count * t.element_size;
  }
  return absl::OkStatus();
}

// Bytes reduced and pushed at a time: the reduced block is copied to the peers while it is
// still in L1 (32 KiB per core on the machines measured; docs/PERFORMANCE.md).
constexpr size_t kPushBlockBytes = size_t{8} << 10;

bool OutputIsRegion(const HostCommView& view, const StagedTensor& t) {
  return t.in_place && t.output == view.data[view.rank] + t.offset;
}

// Reduces this rank's chunk of one tensor block by block and pushes each reduced block into
// the same place of every peer's data region. Only this rank reads or writes its chunk in
// any region until the next barrier, so the writes race with no one. When the output is not
// the region itself, the block is reduced straight into it (an outside input is staged
// already, so an output overlapping it is not read any more) and the region keeps its input.
void ReduceAndPush(const HostCommView& view, const StagedTensor& t, ReduceOp op) {
  const int w = view.world_size;
  const std::byte* srcs[kMaxWorldSize];
  Sources(view, t.offset, srcs);
  const ChunkRange mine = Chunk(t.count, w, view.rank);
  const size_t block = std::max<size_t>(1, kPushBlockBytes / t.element_size);
  for (size_t begin = mine.begin; begin < mine.end; begin += block) {
    const size_t n = std::min(block, mine.end - begin);
    const size_t at = begin * t.element_size;
    std::byte* own = view.data[view.rank] + t.offset + at;
    std::byte* reduced = OutputIsRegion(view, t) ? own : t.output + at;
    ReduceInto(t.dtype, op, srcs, w, begin, n, reduced, w);
    for (int p = 0; p < w; ++p) {
      if (p != view.rank) std::memcpy(view.data[p] + t.offset + at, reduced, n * t.element_size);
    }
  }
}

// Push-based two-shot: each rank reduces its chunk and pushes it into every peer's region
// (ReduceAndPush); after one barrier every region holds the whole result, which a rank
// copies to its output unless that is the region itself. No closing barrier: after it no
// rank reads a peer's region, and a peer writes into this region again only after the next
// call's exchange, to which this rank sends after its copy-out. The exchange and one barrier
// in all (the three-barrier pull version re-read from the peers what it had just reduced).
absl::Status TwoShot(const HostCommView& view, const StagingPlan& plan, ReduceOp op) {
  for (const StagedTensor& t : plan.tensors) ReduceAndPush(view, t, op);
  RETURN_IF_ERROR(HostBarrier(view, CollectiveName(CollectiveOp::kAllReduce)));
  for (const StagedTensor& t : plan.tensors) {
    if (OutputIsRegion(view, t)) continue;  // complete
    const ChunkRange mine = Chunk(t.count, view.world_size, view.rank);
    const std::byte* region = view.data[view.rank] + t.offset;
    // Everything but this rank's chunk, which ReduceAndPush wrote to the output already.
    std::memcpy(t.output, region, mine.begin * t.element_size);
    std::memcpy(t.output + mine.end * t.element_size, region + mine.end * t.element_size,
                (t.count - mine.end) * t.element_size);
  }
  return absl::OkStatus();
}

// All-gather: block p of the output is rank p's whole staged input. All-to-all: block p is
// chunk `rank` of rank p's staged input (its block for this rank).
absl::Status Gather(const HostCommView& view, CollectiveOp kind,
                    absl::Span<const TensorArgs> tensors, NanCheck nan_check,
                    CollectiveResult* result) {
  PreparedCollective p;
  RETURN_IF_ERROR(Prepare(view, CallSignature{.kind = kind, .tensors = tensors}, &p));
  if (result != nullptr) *result = CollectiveResult{};
  const StagingPlan& plan = p.plan;
  if (plan.tensors.empty()) return absl::OkStatus();
  HostExchange x(view, CollectiveName(kind));
  RETURN_IF_ERROR(Stage(x, p, nan_check, result));
  for (const StagedTensor& t : plan.tensors) {
    const size_t bytes = t.count * t.element_size;
    const size_t from =
        kind == CollectiveOp::kAllToAll ? static_cast<size_t>(view.rank) * bytes : 0;
    for (int p = 0; p < view.world_size; ++p) {
      std::memcpy(t.output + static_cast<size_t>(p) * bytes, view.data[p] + t.offset + from, bytes);
    }
  }
  return HostBarrier(view, CollectiveName(kind));
}

// Every rank but the root copies the root's staged buffer into its own; the closing barrier
// keeps the root's region unchanged until then.
absl::Status ReadRoot(const HostCommView& view, const StagingPlan& plan, int root) {
  if (view.rank != root) {
    for (const StagedTensor& t : plan.tensors) {
      std::memcpy(t.output, view.data[root] + t.offset, t.count * t.element_size);
    }
  }
  return HostBarrier(view, CollectiveName(CollectiveOp::kBroadcast));
}

absl::Status ScatterReduced(const HostCommView& view, const StagingPlan& plan, ReduceOp op) {
  const std::byte* srcs[kMaxWorldSize];
  for (const StagedTensor& t : plan.tensors) {
    Sources(view, t.offset, srcs);
    ReduceInto(t.dtype, op, srcs, view.world_size, static_cast<size_t>(view.rank) * t.count,
               t.count, t.output, view.world_size);
  }
  return HostBarrier(view, CollectiveName(CollectiveOp::kReduceScatter));
}

}  // namespace

absl::Status Barrier(const HostCommView& view) {
  RETURN_IF_ERROR(ValidateHostCommView(view));
  RETURN_IF_ERROR(CheckNotAborted(view, "barrier"));
  return HostBarrier(view, "barrier");
}

absl::Status PrepareAllReduce(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                              ReduceOp op, Algorithm algorithm, PreparedCollective* out) {
  const CollectiveOp kind = CollectiveOp::kAllReduce;
  out->data = nullptr;
  RETURN_IF_ERROR(CheckOp(kind, op, tensors));
  if (!IsValid(algorithm)) {
    return absl::InvalidArgumentError(absl::StrCat("all_reduce: algorithm ",
                                                   static_cast<int>(algorithm),
                                                   " is not one of 0 (one-shot), 1 (two-shot)"));
  }
  return Prepare(view, {.kind = kind, .op = op, .algorithm = algorithm, .tensors = tensors}, out);
}

absl::Status AllReducePrepared(const HostCommView& view, const PreparedCollective& prepared,
                               NanCheck nan_check, CollectiveResult* result) {
  RETURN_IF_ERROR(CheckPrepared(view, prepared, CollectiveOp::kAllReduce, result));
  const StagingPlan& plan = prepared.plan;
  if (plan.tensors.empty()) return absl::OkStatus();
  HostExchange x(view, CollectiveName(CollectiveOp::kAllReduce));
  RETURN_IF_ERROR(Stage(x, prepared, nan_check, result));
  const ReduceOp op = prepared.op;
  if (prepared.carries) {
    ReduceCarried(x, plan, op);
    return absl::OkStatus();
  }
  return prepared.algorithm == Algorithm::kOneShot ? OneShot(view, plan, op)
                                                   : TwoShot(view, plan, op);
}

absl::Status AllReduceCoalesced(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                                ReduceOp op, Algorithm algorithm, NanCheck nan_check,
                                CollectiveResult* result) {
  PreparedCollective prepared;
  RETURN_IF_ERROR(PrepareAllReduce(view, tensors, op, algorithm, &prepared));
  return AllReducePrepared(view, prepared, nan_check, result);
}

absl::Status AllGatherCoalesced(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                                NanCheck nan_check, CollectiveResult* result) {
  return Gather(view, CollectiveOp::kAllGather, tensors, nan_check, result);
}

absl::Status ReduceScatterCoalesced(const HostCommView& view, absl::Span<const TensorArgs> tensors,
                                    ReduceOp op, NanCheck nan_check, CollectiveResult* result) {
  const CollectiveOp kind = CollectiveOp::kReduceScatter;
  RETURN_IF_ERROR(CheckOp(kind, op, tensors));
  PreparedCollective p;
  RETURN_IF_ERROR(Prepare(view, CallSignature{.kind = kind, .op = op, .tensors = tensors}, &p));
  if (result != nullptr) *result = CollectiveResult{};
  if (p.plan.tensors.empty()) return absl::OkStatus();
  HostExchange x(view, CollectiveName(kind));
  RETURN_IF_ERROR(Stage(x, p, nan_check, result));
  return ScatterReduced(view, p.plan, op);
}

size_t OversubscribedOneShotMaxBytes(int world_size) {
  if (world_size <= OnlineCpus()) return 0;
  return ExchangeSlotBytes(world_size) - kExchangePayloadOffset;
}

absl::Status AllReduce(const HostCommView& view, const void* input, void* output, size_t count,
                       DataType dtype, ReduceOp op, Algorithm algorithm, NanCheck nan_check,
                       CollectiveResult* result) {
  const TensorArgs t{input, output, count, dtype};
  return AllReduceCoalesced(view, absl::MakeConstSpan(&t, 1), op, algorithm, nan_check, result);
}

absl::Status AllGather(const HostCommView& view, const void* input, void* output, size_t count,
                       DataType dtype, NanCheck nan_check, CollectiveResult* result) {
  const TensorArgs t{input, output, count, dtype};
  return AllGatherCoalesced(view, absl::MakeConstSpan(&t, 1), nan_check, result);
}

absl::Status ReduceScatter(const HostCommView& view, const void* input, void* output, size_t count,
                           DataType dtype, ReduceOp op, NanCheck nan_check,
                           CollectiveResult* result) {
  const TensorArgs t{input, output, count, dtype};
  return ReduceScatterCoalesced(view, absl::MakeConstSpan(&t, 1), op, nan_check, result);
}

absl::Status Broadcast(const HostCommView& view, void* buffer, size_t count, DataType dtype,
                       int root, NanCheck nan_check, CollectiveResult* result) {
  const CollectiveOp kind = CollectiveOp::kBroadcast;
  const TensorArgs t{buffer, buffer, count, dtype};
  const absl::Span<const TensorArgs> tensors = absl::MakeConstSpan(&t, 1);
  PreparedCollective p;
  RETURN_IF_ERROR(Prepare(view, CallSignature{.kind = kind, .root = root, .tensors = tensors}, &p));
  if (result != nullptr) *result = CollectiveResult{};
  if (p.plan.tensors.empty()) return absl::OkStatus();
  HostExchange x(view, CollectiveName(kind));
  RETURN_IF_ERROR(Stage(x, p, nan_check, result));
  return ReadRoot(view, p.plan, root);
}

absl::Status AllToAll(const HostCommView& view, const void* input, void* output, size_t count,
                      DataType dtype, NanCheck nan_check, CollectiveResult* result) {
  const TensorArgs t{input, output, count, dtype};
  return Gather(view, CollectiveOp::kAllToAll, absl::MakeConstSpan(&t, 1), nan_check, result);
}

}  // namespace commd::kernels
