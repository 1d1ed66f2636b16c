// The steps of a spanning group's collectives on CUDA memory: see span_plan.h.
#include "kernels/span_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace commd::kernels {
namespace {

absl::Status CheckShape(const SpanShape& s) {
  if (s.node < 0 || s.node >= static_cast<int>(s.node_sizes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("node ", s.node, " is out of range [0, ",
                                                   static_cast<int>(s.node_sizes.size()) - 1,
                                                   "] of the layout"));
  }
  for (size_t n = 0; n < s.node_sizes.size(); ++n) {
    if (s.node_sizes[n] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", n, " of the layout has ", s.node_sizes[n], " ranks (at least 1)"));
    }
  }
  const int local = s.node_sizes[static_cast<size_t>(s.node)];
  if (s.local_rank < 0 || s.local_rank >= local) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", s.local_rank, " is out of range [0, ", local - 1, "] on node ", s.node));
  }
  return absl::OkStatus();
}

bool Uniform(const SpanShape& s) {
  return std::all_of(s.node_sizes.begin(), s.node_sizes.end(),
                     [&](int n) { return n == s.node_sizes[0]; });
}

int GlobalSize(const SpanShape& s) {
  int g = 0;
  for (int n : s.node_sizes) g += n;
  return g;
}

SpanNcclOp NcclOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAvg:
      return SpanNcclOp::kPreMulSumAvg;
    case ReduceOp::kMin:
      return SpanNcclOp::kMin;
    case ReduceOp::kMax:
      return SpanNcclOp::kMax;
    default:
      return SpanNcclOp::kSum;
  }
}

// The leaders' path for `count` elements at byte `offset`: node-local all-reduce, lane 0,
// node-local broadcast from the leader.
void LeadersAllReduce(const SpanShape& s, size_t offset, size_t count, DataType dtype, ReduceOp op,
                      SpanPlan& plan) {
  if (count == 0) return;
  const ReduceOp local_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  SpanStep base{.offset = offset, .count = count, .dtype = dtype, .local_op = local_op};
  SpanStep reduce = base;
  reduce.kind = SpanStepKind::kLocalAllReduce;
  reduce.reads_input = true;
  plan.steps.push_back(reduce);
  if (s.local_rank == 0) {
    SpanStep nccl = base;
    nccl.kind = SpanStepKind::kNcclAllReduce;
    nccl.nccl_op = NcclOpOf(op);
    nccl.lane = 0;
    plan.steps.push_back(nccl);
    plan.uses_lane = true;
  }
  SpanStep bcast = base;
  bcast.kind = SpanStepKind::kLocalBroadcast;
  bcast.root = 0;
  plan.steps.push_back(bcast);
}

}  // namespace

absl::StatusOr<SpanPlan> PlanSpanAllReduce(const SpanShape& s, size_t offset, size_t count,
                                           DataType dtype, ReduceOp op, size_t lane_min_bytes) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  if (op == ReduceOp::kAvg && (dtype == DataType::kInt32 || dtype == DataType::kInt64)) {
    return absl::UnimplementedError(absl::StrCat(
        "avg of ", DataTypeName(dtype),
        " across nodes on CUDA memory: NCCL averages over its communicator (the nodes, not the "
        "global ranks), and the premultiplied sum that weighs every global rank needs a "
        "scalar 1/",
        GlobalSize(s), " an integer cannot hold; use sum and divide"));
  }
  SpanPlan plan;
  const int local = s.node_sizes[static_cast<size_t>(s.node)];
  const size_t es = DataTypeSize(dtype);
  const bool lanes = Uniform(s) && local > 1 && count >= static_cast<size_t>(local) &&
                     count * es >= lane_min_bytes;
  size_t body = 0;
  if (lanes) {
    const size_t chunk = count / static_cast<size_t>(local);
    body = chunk * static_cast<size_t>(local);
    const ReduceOp local_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const SpanStep base{.offset = offset, .count = chunk, .dtype = dtype, .local_op = local_op};
    SpanStep rs = base;
    rs.kind = SpanStepKind::kLocalReduceScatter;
    rs.reads_input = true;
    plan.steps.push_back(rs);
    SpanStep nccl = base;
    nccl.kind = SpanStepKind::kNcclAllReduce;
    nccl.offset = offset + static_cast<size_t>(s.local_rank) * chunk * es;
    nccl.nccl_op = NcclOpOf(op);
    nccl.lane = s.local_rank;
    nccl.from_scratch = true;
    plan.steps.push_back(nccl);
    plan.uses_lane = true;
    for (int p = 0; p < local; ++p) {
      SpanStep bcast = base;
      bcast.kind = SpanStepKind::kLocalBroadcast;
      bcast.offset = offset + static_cast<size_t>(p) * chunk * es;
      bcast.root = p;
      plan.steps.push_back(bcast);
    }
    plan.scratch_bytes = chunk * es;
  }
  LeadersAllReduce(s, offset + body * es, count - body, dtype, op, plan);
  return plan;
}

absl::StatusOr<SpanPlan> PlanSpanBroadcast(const SpanShape& s, size_t count, DataType dtype,
                                           int root_node, int root_local) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  if (root_node < 0 || root_node >= static_cast<int>(s.node_sizes.size()) || root_local < 0 ||
      root_local >= s.node_sizes[static_cast<size_t>(root_node)]) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root (node ", root_node, ", local rank ", root_local,
                     ") is not in the layout of ", s.node_sizes.size(), " nodes"));
  }
  SpanPlan plan;
  if (count == 0) return plan;
  const SpanStep base{.offset = 0, .count = count, .dtype = dtype};
  const bool root_here = s.node == root_node;
  if (root_here) {
    SpanStep local = base;
    local.kind = SpanStepKind::kLocalBroadcast;
    local.root = root_local;
    local.reads_input = true;
    plan.steps.push_back(local);
  }
  if (s.local_rank == 0) {
    SpanStep nccl = base;
    nccl.kind = SpanStepKind::kNcclBroadcast;
    nccl.root = root_node;
    nccl.lane = 0;
    plan.steps.push_back(nccl);
    plan.uses_lane = true;
  }
  if (!root_here) {
    SpanStep local = base;
    local.kind = SpanStepKind::kLocalBroadcast;
    local.root = 0;
    plan.steps.push_back(local);
  }
  return plan;
}

absl::StatusOr<SpanPlan> PlanSpanBarrier(const SpanShape& s) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  SpanPlan plan;
  plan.steps.push_back({.kind = SpanStepKind::kLocalBarrier});
  if (s.local_rank == 0) {
    plan.steps.push_back({.kind = SpanStepKind::kNcclAllReduce,
                          .count = 1,
                          .dtype = DataType::kInt32,
                          .nccl_op = SpanNcclOp::kSum,
                          .lane = 0,
                          .from_scratch = true,
                          .to_scratch = true});
    plan.uses_lane = true;
  }
  plan.steps.push_back({.kind = SpanStepKind::kLocalBarrier});
  plan.scratch_bytes = sizeof(int32_t);
  return plan;
}

void AppendSpanPlan(SpanPlan& plan, const SpanPlan& more) {
  plan.steps.insert(plan.steps.end(), more.steps.begin(), more.steps.end());
  plan.scratch_bytes = std::max(plan.scratch_bytes, more.scratch_bytes);
  plan.uses_lane = plan.uses_lane || more.uses_lane;
}

}  // namespace commd::kernels
