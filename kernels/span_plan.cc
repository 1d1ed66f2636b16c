// The steps of a spanning group's collectives on CUDA memory: see span_plan.h.
#include "kernels/span_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

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
  if (s.global_ranks.empty()) return absl::OkStatus();
  int global = 0;
  for (int n : s.node_sizes) global += n;
  std::vector<bool> seen(static_cast<size_t>(global), false);
  for (size_t n = 0; n < s.node_sizes.size(); ++n) {
    if (n >= s.global_ranks.size() ||
        static_cast<int>(s.global_ranks[n].size()) != s.node_sizes[n]) {
      return absl::InvalidArgumentError(absl::StrCat("the layout's global ranks do not name node ",
                                                     n, "'s ", s.node_sizes[n], " ranks"));
    }
    for (int g : s.global_ranks[n]) {
      if (g < 0 || g >= global || seen[static_cast<size_t>(g)]) {
        return absl::InvalidArgumentError(absl::StrCat("global rank ", g, " on node ", n,
                                                       " is out of range [0, ", global - 1,
                                                       "] or named twice"));
      }
      seen[static_cast<size_t>(g)] = true;
    }
  }
  return absl::OkStatus();
}

int GlobalRankOf(const SpanShape& s, int node, int local) {
  if (!s.global_ranks.empty()) {
    return s.global_ranks[static_cast<size_t>(node)][static_cast<size_t>(local)];
  }
  int g = 0;
  for (int n = 0; n < node; ++n) g += s.node_sizes[static_cast<size_t>(n)];
  return g + local;
}

// Node `node`'s local ranks as runs of consecutive global ranks: (first local rank, length).
std::vector<std::pair<int, int>> Runs(const SpanShape& s, int node) {
  std::vector<std::pair<int, int>> runs;
  for (int l = 0; l < s.node_sizes[static_cast<size_t>(node)]; ++l) {
    if (!runs.empty() &&
        GlobalRankOf(s, node, runs.back().first) + runs.back().second == GlobalRankOf(s, node, l)) {
      ++runs.back().second;
    } else {
      runs.push_back({l, 1});
    }
  }
  return runs;
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

// bool's sum is a logical or, which NCCL's sum of uint8 is not (1 + 1 = 2): its max is.
SpanNcclOp NcclOpOf(ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool && op == ReduceOp::kSum) return SpanNcclOp::kMax;
  switch (op) {
    case ReduceOp::kAvg:
      return SpanNcclOp::kPreMulSumAvg;
    case ReduceOp::kMin:
      return SpanNcclOp::kMin;
    case ReduceOp::kMax:
      return SpanNcclOp::kMax;
    case ReduceOp::kProduct:  // bool's product is an and, which NCCL's uint8 product is too
      return SpanNcclOp::kProduct;
    default:
      return SpanNcclOp::kSum;
  }
}

// Appends `step`, which reads `count` of this rank's input elements at byte `offset`: on a
// node of more than one rank it counts their NaN/Inf itself (reads_input); on a node of one
// rank it never runs (Launch skips meetings there), so a kCountNonFinite of the same elements
// goes first.
void PushReadingInput(const SpanShape& s, SpanStep step, size_t offset, size_t count,
                      SpanPlan& plan) {
  const bool alone = s.node_sizes[static_cast<size_t>(s.node)] == 1;
  if (alone && count > 0) {
    plan.steps.push_back({.kind = SpanStepKind::kCountNonFinite,
                          .offset = offset,
                          .count = count,
                          .dtype = step.dtype,
                          .reads_input = true});
  }
  step.reads_input = !alone;
  plan.steps.push_back(std::move(step));
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
  PushReadingInput(s, reduce, offset, count, plan);
  if (s.local_rank == 0) {
    SpanStep nccl = base;
    nccl.kind = SpanStepKind::kNcclAllReduce;
    nccl.nccl_op = NcclOpOf(op, dtype);
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
  if (dtype == DataType::kInt16) {
    return absl::UnimplementedError(
        "reductions of int16 across nodes on CUDA memory: NCCL has no 16-bit integer type; "
        "reduce int32 (or keep the group on host memory)");
  }
  if (op == ReduceOp::kBAnd || op == ReduceOp::kBOr || op == ReduceOp::kBXor) {
    return absl::UnimplementedError(
        absl::StrCat(ReduceOpName(op),
                     " across nodes on CUDA memory: NCCL has no bitwise reductions; keep "
                     "the group on host memory, whose path between nodes has them"));
  }
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
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
    rs.reads_input = true;  // lanes need local > 1
    plan.steps.push_back(rs);
    SpanStep nccl = base;
    nccl.kind = SpanStepKind::kNcclAllReduce;
    nccl.offset = offset + static_cast<size_t>(s.local_rank) * chunk * es;
    nccl.nccl_op = NcclOpOf(op, dtype);
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
    // Every local rank's step reads_input alike; only the root's kernel counts (its input is
    // the one broadcast).
    PushReadingInput(s, local, 0, count, plan);
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

absl::StatusOr<SpanPlan> PlanSpanAllGather(const SpanShape& s, size_t count, DataType dtype) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  SpanPlan plan;
  if (count == 0) return plan;
  const int local = s.node_sizes[static_cast<size_t>(s.node)];
  const size_t es = DataTypeSize(dtype), block = count * es;
  const SpanStep base{.count = count, .dtype = dtype};
  if (local > 1) {
    SpanStep gather = base;
    gather.kind = SpanStepKind::kLocalAllGather;
    gather.reads_input = true;
    plan.steps.push_back(gather);
    plan.scratch_bytes = static_cast<size_t>(local) * block;
  } else {  // no node-local kernel reads the input here
    plan.steps.push_back({.kind = SpanStepKind::kCountNonFinite,
                          .count = count,
                          .dtype = dtype,
                          .reads_input = true});
  }
  // Where local rank l's block is on the leader: the scratch in local order, or on a node of
  // one rank its input (no node-local step runs there).
  const SpanBuffer from = local > 1 ? SpanBuffer::kScratch : SpanBuffer::kIn;
  auto from_offset = [&](int l) { return local > 1 ? static_cast<size_t>(l) * block : 0; };
  if (s.local_rank == 0) {
    for (const auto& [first, n] : Runs(s, s.node)) {
      SpanStep copy = base;
      copy.kind = SpanStepKind::kLocalCopy;
      copy.count = count * static_cast<size_t>(n);
      copy.buffer = from;
      copy.offset = from_offset(first);
      copy.dst = SpanBuffer::kOut;
      copy.dst_offset = static_cast<size_t>(GlobalRankOf(s, s.node, first)) * block;
      plan.steps.push_back(copy);
    }
    SpanStep x = base;
    x.kind = SpanStepKind::kNcclSendRecv;
    x.lane = 0;
    for (int k = 0; k < static_cast<int>(s.node_sizes.size()); ++k) {
      if (k == s.node) continue;
      for (const auto& [first, n] : Runs(s, s.node)) {
        x.transfers.push_back({.send = true,
                               .peer = k,
                               .buffer = from,
                               .offset = from_offset(first),
                               .count = count * static_cast<size_t>(n)});
      }
      for (const auto& [first, n] : Runs(s, k)) {
        x.transfers.push_back({.send = false,
                               .peer = k,
                               .buffer = SpanBuffer::kOut,
                               .offset = static_cast<size_t>(GlobalRankOf(s, k, first)) * block,
                               .count = count * static_cast<size_t>(n)});
      }
    }
    if (!x.transfers.empty()) {
      plan.steps.push_back(std::move(x));
      plan.uses_lane = true;
    }
  }
  if (local > 1) {
    SpanStep bcast = base;
    bcast.kind = SpanStepKind::kLocalBroadcast;
    bcast.buffer = SpanBuffer::kOut;
    bcast.count = count * static_cast<size_t>(GlobalSize(s));
    bcast.root = 0;
    plan.steps.push_back(bcast);
  }
  return plan;
}

absl::StatusOr<SpanPlan> PlanSpanReduceScatter(const SpanShape& s, size_t count, DataType dtype,
                                               ReduceOp op, size_t lane_min_bytes) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  const size_t global = static_cast<size_t>(GlobalSize(s));
  ASSIGN_OR_RETURN(SpanPlan plan,
                   PlanSpanAllReduce(s, 0, global * count, dtype, op, lane_min_bytes));
  if (count == 0) return plan;
  const size_t block = count * DataTypeSize(dtype);
  plan.steps.push_back(
      {.kind = SpanStepKind::kLocalCopy,
       .offset = static_cast<size_t>(GlobalRankOf(s, s.node, s.local_rank)) * block,
       .count = count,
       .dtype = dtype,
       .buffer = SpanBuffer::kIn,
       .dst = SpanBuffer::kOut});
  return plan;
}

absl::StatusOr<SpanPlan> PlanSpanAllToAll(const SpanShape& s, size_t count, DataType dtype) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  SpanPlan plan;
  if (count == 0) return plan;
  const int local = s.node_sizes[static_cast<size_t>(s.node)];
  const size_t block = count * DataTypeSize(dtype);
  auto at = [&](int node, int l) { return static_cast<size_t>(GlobalRankOf(s, node, l)) * block; };
  const SpanStep base{.count = count, .dtype = dtype};
  // Only copies and NCCL read the input afterwards: its NaN/Inf are counted here, on every
  // rank, before the barrier lets a peer's copy or the leader's sends read it.
  plan.steps.push_back({.kind = SpanStepKind::kCountNonFinite,
                        .count = count * static_cast<size_t>(GlobalSize(s)),
                        .dtype = dtype,
                        .reads_input = true});
  plan.steps.push_back({.kind = SpanStepKind::kLocalBarrier});
  // Within the node: this rank's block for local rank q goes to q's output at this rank's place.
  for (int q = 0; q < local; ++q) {
    SpanStep copy = base;
    copy.kind = SpanStepKind::kLocalCopy;
    copy.buffer = SpanBuffer::kIn;
    copy.offset = at(s.node, q);
    copy.dst = SpanBuffer::kOut;
    copy.dst_owner = q == s.local_rank ? -1 : q;
    copy.dst_offset = at(s.node, s.local_rank);
    plan.steps.push_back(copy);
  }
  if (s.local_rank == 0) {
    SpanStep x = base;
    x.kind = SpanStepKind::kNcclSendRecv;
    x.lane = 0;
    auto owner = [](int l) { return l == 0 ? -1 : l; };
    for (int k = 0; k < static_cast<int>(s.node_sizes.size()); ++k) {
      if (k == s.node) continue;
      // Sender order: for each local rank p here, its blocks for k's ranks in k's local order;
      // the receiver posts its receives in the same (p, q) order.
      for (int p = 0; p < local; ++p) {
        for (int q = 0; q < s.node_sizes[static_cast<size_t>(k)]; ++q) {
          x.transfers.push_back({.send = true,
                                 .peer = k,
                                 .buffer = SpanBuffer::kIn,
                                 .owner = owner(p),
                                 .offset = at(k, q),
                                 .count = count});
        }
      }
      for (int p = 0; p < s.node_sizes[static_cast<size_t>(k)]; ++p) {
        for (int q = 0; q < local; ++q) {
          x.transfers.push_back({.send = false,
                                 .peer = k,
                                 .buffer = SpanBuffer::kOut,
                                 .owner = owner(q),
                                 .offset = at(k, p),
                                 .count = count});
        }
      }
    }
    if (!x.transfers.empty()) {
      plan.steps.push_back(std::move(x));
      plan.uses_lane = true;
    }
  }
  plan.steps.push_back({.kind = SpanStepKind::kLocalBarrier});
  return plan;
}

void AppendSpanPlan(SpanPlan& plan, const SpanPlan& more) {
  plan.steps.insert(plan.steps.end(), more.steps.begin(), more.steps.end());
  plan.scratch_bytes = std::max(plan.scratch_bytes, more.scratch_bytes);
  plan.uses_lane = plan.uses_lane || more.uses_lane;
}

}  // namespace commd::kernels
