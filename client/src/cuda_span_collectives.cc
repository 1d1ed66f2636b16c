// The collectives of a group spanning nodes on CUDA memory: see cuda_span_collectives.h.
#include "client/src/cuda_span_collectives.h"

#include <cuda.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/src/cuda_span_nccl.h"
#include "common/cuda_driver_api.h"
#include "common/status_macros.h"
#include "kernels/types.h"

namespace commd {
namespace {

using kernels::SpanStep;
using kernels::SpanStepKind;

bool IsNccl(SpanStepKind k) {
  return k == SpanStepKind::kNcclAllReduce || k == SpanStepKind::kNcclBroadcast ||
         k == SpanStepKind::kNcclSendRecv;
}

// The node-local kernels every local rank meets in (a copy or a count is this rank's alone).
bool IsMeeting(SpanStepKind k) {
  return !IsNccl(k) && k != SpanStepKind::kLocalCopy && k != SpanStepKind::kCountNonFinite;
}

// A call's buffers as the plan names them (kernels::SpanBuffer): this rank's and, through
// their mappings, its node's peers'.
struct Buffers {
  const kernels::CudaCommView* in = nullptr;
  const kernels::CudaCommView* out = nullptr;  // null for in-place collectives
  std::byte* scratch = nullptr;

  absl::StatusOr<const kernels::CudaCommView*> View(kernels::SpanBuffer which) const {
    const kernels::CudaCommView* v = which == kernels::SpanBuffer::kOut ? out : in;
    if (which == kernels::SpanBuffer::kScratch || v == nullptr) {
      return absl::InternalError(absl::StrCat("a step over buffer ", static_cast<int>(which),
                                              ", which this call has no view of"));
    }
    return v;
  }
  // `bytes` at byte `offset` of `which` of local rank `owner` (-1: this rank), checked against
  // the region (the plan derives every offset from the checked call; this guards the plan).
  absl::StatusOr<std::byte*> At(kernels::SpanBuffer which, int owner, size_t offset,
                                size_t bytes) const {
    if (which == kernels::SpanBuffer::kScratch) {
      if (owner >= 0 || scratch == nullptr) {
        return absl::InternalError("a step names another rank's scratch, or none was made");
      }
      return scratch + offset;
    }
    ASSIGN_OR_RETURN(const kernels::CudaCommView* v, View(which));
    const int rank = owner < 0 ? v->rank : owner;
    if (rank >= v->world_size || offset > v->data_bytes || bytes > v->data_bytes - offset) {
      return absl::InternalError(absl::StrCat(
          "a step's ", bytes, " bytes at ", offset, " of local rank ", rank,
          "'s region pass its end (", v->data_bytes, " bytes) or its rank is not on this node"));
    }
    return v->data[rank] + offset;
  }
};

// A stream-ordered device copy (the driver's, so a peer's region is reached through its
// mapping here).
absl::Status Copy(const SpanStep& st, const Buffers& b, cudaStream_t stream) {
  const size_t bytes = st.count * DataTypeSize(st.dtype);
  ASSIGN_OR_RETURN(std::byte * from, b.At(st.buffer, st.src_owner, st.offset, bytes));
  ASSIGN_OR_RETURN(std::byte * to, b.At(st.dst, st.dst_owner, st.dst_offset, bytes));
  ASSIGN_OR_RETURN(const CudaDriverApi* cu, CudaDriver());
  if (const CUresult r = cu->memcpy_dtod_async(reinterpret_cast<CUdeviceptr>(to),
                                               reinterpret_cast<CUdeviceptr>(from), bytes,
                                               reinterpret_cast<CUstream>(stream));
      r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cu->get_error_name(r, &name);
    return absl::InternalError(absl::StrCat("cuMemcpyDtoDAsync of ", bytes,
                                            " bytes: ", name != nullptr ? name : "error ",
                                            name != nullptr ? "" : absl::StrCat(r)));
  }
  return absl::OkStatus();
}

class CudaSpanPartImpl : public CudaSpanPart {
 public:
  explicit CudaSpanPartImpl(SpanSetup s)
      : agreement_(std::move(s)), s_(agreement_.setup()), lane_(agreement_) {
    for (const NodeRanks& n : s_.layout) {
      shape_.node_sizes.push_back(static_cast<int>(n.global_ranks.size()));
      shape_.global_ranks.emplace_back(n.global_ranks.begin(), n.global_ranks.end());
    }
    shape_.node = s_.node_index;
    shape_.local_rank = s_.local_rank;
  }

  absl::Status Agree(const CheckedCall& c) override {
    RETURN_IF_ERROR(lane_.Poll());
    RETURN_IF_ERROR(agreement_.Agree(c));
    // Every rank has entered this call, so every member of a communicator made by the last
    // one has read its unique id: the key can go (SpanNcclLane).
    lane_.DeletePublished();
    return absl::OkStatus();
  }

  absl::StatusOr<kernels::SpanPlan> Plan(const CheckedCall& c) override {
    const CollectiveCall& call = c.call;
    absl::StatusOr<kernels::SpanPlan> plan =
        call.matmul != nullptr ? absl::UnimplementedError(Unsupported(call)) : PlanOf(call);
    if (plan.ok()) return plan;
    return absl::Status(plan.status().code(),
                        absl::StrCat(CollectiveName(call.kind), " on group ", s_.group, ": ",
                                     plan.status().message()));
  }

  absl::Status Launch(const kernels::SpanPlan& plan, const kernels::CudaCommView& v,
                      const kernels::CudaCommView* out, kernels::NanCheck nan,
                      const kernels::AllReduceThresholds& thresholds, void* scratch,
                      cudaStream_t stream, int* enqueued) override {
    const Buffers b{.in = &v, .out = out, .scratch = static_cast<std::byte*>(scratch)};
    for (const SpanStep& st : plan.steps) {
      // A node of one rank has nothing to meet within (its buffer already is the node's).
      if (IsMeeting(st.kind) && v.world_size == 1) continue;
      const kernels::NanCheck step_nan = st.reads_input ? nan : kernels::NanCheck::kOff;
      // A count of a call that is not checked has nothing to do.
      if (st.kind == SpanStepKind::kCountNonFinite && step_nan != kernels::NanCheck::kOn) continue;
      RETURN_IF_ERROR(LaunchStep(st, b, step_nan, thresholds, stream));
      ++*enqueued;
    }
    return absl::OkStatus();
  }

  void Close() override {
    agreement_.Close();
    lane_.Close();
  }

  void Failed(const absl::Status& why) override {
    agreement_.RequestAbort("a collective across nodes on CUDA memory", why.message());
  }

 private:
  // The plan of `call` (no fused matmul), the same on every rank.
  absl::StatusOr<kernels::SpanPlan> PlanOf(const CollectiveCall& call) const {
    const auto dtype = call.dtype;
    const auto op = call.op;
    switch (call.kind) {
      case CollectiveOp::kAllReduce:
        return kernels::PlanSpanAllReduce(shape_, 0, call.count, dtype, op,
                                          kernels::kSpanLaneMinBytes);
      case CollectiveOp::kAllReduceCoalesced: {
        kernels::SpanPlan all;
        for (const CoalescedTensor& t : call.tensors) {
          absl::StatusOr<kernels::SpanPlan> plan = kernels::PlanSpanAllReduce(
              shape_, t.offset, t.count, t.dtype, op, kernels::kSpanLaneMinBytes);
          if (!plan.ok()) return plan;
          kernels::AppendSpanPlan(all, *plan);
        }
        return all;
      }
      case CollectiveOp::kBroadcast: {
        const auto [node, local] = agreement_.Locate(call.root);
        return kernels::PlanSpanBroadcast(shape_, call.count, dtype, node, local);
      }
      case CollectiveOp::kBarrier:
        return kernels::PlanSpanBarrier(shape_);
      case CollectiveOp::kAllGather:
        return kernels::PlanSpanAllGather(shape_, call.count, dtype);
      case CollectiveOp::kReduceScatter:
        return kernels::PlanSpanReduceScatter(shape_, call.count, dtype, op,
                                              kernels::kSpanLaneMinBytes);
      case CollectiveOp::kAllToAll:
        return kernels::PlanSpanAllToAll(shape_, call.count, dtype);
      default:
        return absl::UnimplementedError(Unsupported(call));
    }
  }

  // Enqueues one step of this rank's plan on `stream`.
  absl::Status LaunchStep(const SpanStep& st, const Buffers& b, kernels::NanCheck step_nan,
                          const kernels::AllReduceThresholds& thresholds, cudaStream_t stream) {
    const kernels::CudaCommView& v = *b.in;
    std::byte* region = v.data[v.rank];
    void* at = region + st.offset;
    switch (st.kind) {
      case SpanStepKind::kLocalBarrier:
        return kernels::LaunchBarrier(v, stream);
      case SpanStepKind::kLocalAllReduce: {
        const size_t bytes = st.count * DataTypeSize(st.dtype);
        const kernels::Algorithm a =
            kernels::ChooseAllReduceAlgorithm(bytes, st.count, v.world_size, thresholds);
        return kernels::LaunchAllReduce(v, at, at, st.count, st.dtype, st.local_op, a, step_nan,
                                        b.scratch, stream);
      }
      case SpanStepKind::kLocalReduceScatter:
        return kernels::LaunchReduceScatter(v, at, b.scratch, st.count, st.dtype, st.local_op,
                                            step_nan, stream);
      case SpanStepKind::kLocalAllGather:
        return kernels::LaunchAllGather(v, at, b.scratch, st.count, st.dtype, step_nan, stream);
      case SpanStepKind::kLocalBroadcast: {
        ASSIGN_OR_RETURN(const kernels::CudaCommView* view, b.View(st.buffer));
        return kernels::LaunchBroadcast(*view, view->data[view->rank] + st.offset, st.count,
                                        st.dtype, st.root, step_nan, stream);
      }
      case SpanStepKind::kLocalCopy:
        return Copy(st, b, stream);
      case SpanStepKind::kCountNonFinite: {
        const size_t bytes = st.count * DataTypeSize(st.dtype);
        ASSIGN_OR_RETURN(std::byte * in, b.At(kernels::SpanBuffer::kIn, -1, st.offset, bytes));
        return kernels::LaunchCountNonFinite(v, in, st.count, st.dtype, stream);
      }
      case SpanStepKind::kNcclAllReduce:
      case SpanStepKind::kNcclBroadcast:
        return lane_.Collective(st, region, b.scratch, stream);
      case SpanStepKind::kNcclSendRecv:
        return SendRecv(st, b, stream);
    }
    return absl::InternalError(
        absl::StrCat("a step of unknown kind ", static_cast<int>(st.kind), " in the plan"));
  }

  // One group of sends and receives on this rank's lane (see SpanStepKind::kNcclSendRecv),
  // every transfer's address checked first.
  absl::Status SendRecv(const SpanStep& st, const Buffers& b, cudaStream_t stream) {
    const size_t es = DataTypeSize(st.dtype);
    std::vector<std::byte*> at;
    for (const kernels::SpanTransfer& x : st.transfers) {
      ASSIGN_OR_RETURN(std::byte * p, b.At(x.buffer, x.owner, x.offset, x.count * es));
      at.push_back(p);
    }
    return lane_.SendRecv(st, at, stream);
  }

  std::string Unsupported(const CollectiveCall& call) const {
    if (call.matmul != nullptr) {
      return absl::StrCat("the fused matmuls run on groups within one node only (this one spans ",
                          s_.layout.size(),
                          " nodes: their GEMM is fused into the node-local kernels' passes over "
                          "peer memory, which NCCL's steps between the nodes cannot join)");
    }
    return absl::StrCat(
        "across nodes on CUDA memory this SDK runs all-reduce (also coalesced), broadcast, "
        "barrier, all-gather, reduce-scatter and all-to-all (this group spans ",
        s_.layout.size(), " nodes)");
  }

  SpanAgreement agreement_;
  const SpanSetup& s_;  // agreement_'s
  kernels::SpanShape shape_;
  // After agreement_, so destroyed before it. Its destructor aborts the communicator: the
  // group's enqueued work has finished by then (the CUDA backend's state waits for it first).
  SpanNcclLane lane_;
};

}  // namespace

std::unique_ptr<CudaSpanPart> MakeCudaSpanPart(SpanSetup setup) {
  return std::make_unique<CudaSpanPartImpl>(std::move(setup));
}

size_t SpanScratchBytes(const kernels::SpanPlan& plan, int local,
                        const kernels::AllReduceThresholds& thresholds) {
  size_t bytes = plan.scratch_bytes;
  if (local == 1) return bytes;  // no node-local step runs
  for (const SpanStep& st : plan.steps) {
    if (st.kind != SpanStepKind::kLocalAllReduce) continue;
    const size_t b = st.count * DataTypeSize(st.dtype);
    if (kernels::ChooseAllReduceAlgorithm(b, st.count, local, thresholds) ==
        kernels::Algorithm::kOneShot) {
      bytes = std::max(bytes, b);
    }
  }
  return bytes;
}

}  // namespace commd
