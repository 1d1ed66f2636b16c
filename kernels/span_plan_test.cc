// The spanning group's plans on CUDA memory (kernels/span_plan.h), run on a model of the
// hardware: every rank's region and scratch hold, per element, how many times each global
// rank's input went into it; node-local steps run when every local rank of the node has that
// same step next, NCCL steps when every member of the lane has that same step next (else the
// ranks would hang or mismatch on a real machine: the test fails). Over layouts even and
// uneven, counts around every split, offsets and types, an all-reduce must leave every rank
// with every element holding every global rank's input exactly once, and nothing outside the
// call's range touched.
#include "kernels/span_plan.h"

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

using Contribution = std::vector<int>;  // per global rank: how often its input is in here
constexpr int kUntouched = -7;          // marks elements outside the call's range

struct Rank {
  int node, local, global;
  SpanPlan plan;
  size_t next = 0;  // the next step to run
  std::vector<Contribution> region, scratch;
};

std::string Layout(const std::vector<int>& sizes) { return absl::StrJoin(sizes, "x"); }

std::string Describe(const SpanStep& s) {
  return absl::StrCat("kind ", static_cast<int>(s.kind), " offset ", s.offset, " count ", s.count,
                      " lane ", s.lane, " root ", s.root, " dtype ", static_cast<int>(s.dtype),
                      " local_op ", static_cast<int>(s.local_op), " nccl_op ",
                      static_cast<int>(s.nccl_op), " from_scratch ", s.from_scratch, " to_scratch ",
                      s.to_scratch);
}

Contribution Sum(const std::vector<const Contribution*>& parts) {
  Contribution out(parts[0]->size(), 0);
  for (const Contribution* p : parts) {
    for (size_t g = 0; g < out.size(); ++g) out[g] += (*p)[g];
  }
  return out;
}

bool IsNccl(SpanStepKind k) {
  return k == SpanStepKind::kNcclAllReduce || k == SpanStepKind::kNcclBroadcast;
}

// Runs every rank's plan to its end in the model; "" on success, else what went wrong.
// `es`: bytes per element (step offsets are bytes).
std::string Simulate(std::vector<Rank>& ranks, const std::vector<int>& sizes, size_t es) {
  auto members = [&](const SpanStep& s, const Rank& r) {
    std::vector<Rank*> out;
    for (Rank& q : ranks) {
      if (IsNccl(s.kind) ? q.local == s.lane : q.node == r.node) out.push_back(&q);
    }
    return out;
  };
  for (;;) {
    bool progressed = false, done = true;
    for (Rank& r : ranks) {
      if (r.next == r.plan.steps.size()) continue;
      done = false;
      const SpanStep& s = r.plan.steps[r.next];
      if (IsNccl(s.kind) && s.lane != r.local) {
        return absl::StrCat("global rank ", r.global, " runs NCCL on lane ", s.lane,
                            ", not its own lane ", r.local);
      }
      std::vector<Rank*> group = members(s, r);
      if (IsNccl(s.kind)) {
        // Lane l's communicator: rank l of every node (nodes without one have no rank there).
        size_t expected = 0;
        for (int n : sizes) expected += n > s.lane ? 1 : 0;
        if (s.lane > 0 && expected != sizes.size()) {
          return absl::StrCat("lane ", s.lane, " used on uneven nodes ", Layout(sizes));
        }
      }
      bool ready = true;
      for (Rank* q : group) {
        if (q->next == q->plan.steps.size()) {
          return absl::StrCat("global rank ", q->global, " ended its plan while global rank ",
                              r.global, " waits in ", Describe(s));
        }
        const SpanStep& t = q->plan.steps[q->next];
        if (t.kind != s.kind) {
          if (IsNccl(t.kind) == IsNccl(s.kind) && !IsNccl(s.kind)) {
            return absl::StrCat("node ", r.node, ": local ranks ", r.local, " and ", q->local,
                                " launch different node-local kernels: ", Describe(s), " vs ",
                                Describe(t));
          }
          ready = false;
          break;
        }
        // A broadcast's other members (reads_input differs by design only at the root's node).
        SpanStep a = s, b = t;
        a.reads_input = b.reads_input = false;
        if (!(a == b)) {
          return absl::StrCat("global ranks ", r.global, " and ", q->global,
                              " disagree on a step: ", Describe(s), " vs ", Describe(t));
        }
      }
      if (!ready) continue;
      // Run it.
      const size_t first = s.offset / es;
      const size_t from = s.from_scratch ? 0 : first, to = s.to_scratch ? 0 : first;
      auto src = [&](Rank* q) -> std::vector<Contribution>& {
        return s.from_scratch ? q->scratch : q->region;
      };
      auto dst = [&](Rank* q) -> std::vector<Contribution>& {
        return s.to_scratch ? q->scratch : q->region;
      };
      switch (s.kind) {
        case SpanStepKind::kLocalBarrier:
          break;
        case SpanStepKind::kLocalAllReduce:
        case SpanStepKind::kNcclAllReduce:
          for (size_t i = 0; i < s.count; ++i) {
            std::vector<const Contribution*> parts;
            for (Rank* q : group) parts.push_back(&src(q)[from + i]);
            const Contribution sum = Sum(parts);
            for (Rank* q : group) dst(q)[to + i] = sum;
          }
          break;
        case SpanStepKind::kLocalReduceScatter:
          for (Rank* q : group) {
            for (size_t i = 0; i < s.count; ++i) {
              std::vector<const Contribution*> parts;
              for (Rank* p : group) {
                parts.push_back(&p->region[first + static_cast<size_t>(q->local) * s.count + i]);
              }
              q->scratch[i] = Sum(parts);
            }
          }
          break;
        case SpanStepKind::kLocalBroadcast:
        case SpanStepKind::kNcclBroadcast: {
          Rank* root = nullptr;
          for (Rank* q : group) {
            if ((s.kind == SpanStepKind::kLocalBroadcast ? q->local : q->node) == s.root) root = q;
          }
          if (root == nullptr) return absl::StrCat("no root among the members of ", Describe(s));
          for (Rank* q : group) {
            for (size_t e = first; e < first + s.count; ++e) q->region[e] = root->region[e];
          }
          break;
        }
      }
      for (Rank* q : group) ++q->next;
      progressed = true;
    }
    if (done) return "";
    if (!progressed) return "deadlock: no rank's next step can run";
  }
}

// Every rank of `sizes`, its region of `elems` elements holding its own input on [first,
// first + count) and kUntouched elsewhere.
std::vector<Rank> MakeRanks(const std::vector<int>& sizes, size_t elems, size_t first,
                            size_t count) {
  int g = 0;
  for (int n : sizes) g += n;
  std::vector<Rank> ranks;
  int global = 0;
  for (size_t node = 0; node < sizes.size(); ++node) {
    for (int l = 0; l < sizes[node]; ++l, ++global) {
      Rank r{static_cast<int>(node), l, global, {}, 0, {}, {}};
      r.region.assign(elems, Contribution(static_cast<size_t>(g), kUntouched));
      for (size_t e = first; e < first + count; ++e) {
        r.region[e] = Contribution(static_cast<size_t>(g), 0);
        r.region[e][static_cast<size_t>(global)] = 1;
      }
      ranks.push_back(std::move(r));
    }
  }
  return ranks;
}

const std::vector<std::vector<int>> kLayouts = {
    {1, 1}, {2, 2},    {3, 3}, {4, 4}, {2, 2, 2}, {3, 3, 3}, {1, 1, 1, 1},
    {8, 8}, {1, 2, 3}, {3, 1}, {2, 4}, {4, 1, 4}, {16, 16}};

struct Case {
  size_t count;
  size_t lane_min_bytes;
};

TEST(SpanPlanTest, AllReduceSumsEveryGlobalRankOnceIntoEveryRank) {
  int cases = 0;
  for (const std::vector<int>& sizes : kLayouts) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
      const size_t es = DataTypeSize(dtype);
      for (size_t count = 0; count <= 70; ++count) {
        for (size_t lane_min : {size_t{0}, kSpanLaneMinBytes}) {
          for (size_t lead : {size_t{0}, size_t{3}}) {  // elements before the call's range
            const size_t elems = lead + count + 2;
            std::vector<Rank> ranks = MakeRanks(sizes, elems, lead, count);
            size_t scratch = 0;
            for (Rank& r : ranks) {
              const SpanShape shape{.node_sizes = sizes, .node = r.node, .local_rank = r.local};
              auto plan =
                  PlanSpanAllReduce(shape, lead * es, count, dtype, ReduceOp::kSum, lane_min);
              ASSERT_TRUE(plan.ok()) << plan.status();
              r.plan = *plan;
              scratch = std::max(scratch, plan->scratch_bytes);
              ASSERT_EQ(plan->scratch_bytes % es, 0u);
            }
            for (Rank& r : ranks) {
              r.scratch.assign(scratch / es + 1, Contribution(r.region[0].size(), kUntouched));
            }
            const std::string what =
                absl::StrCat("layout ", Layout(sizes), " count ", count, " lane_min ", lane_min,
                             " lead ", lead, " dtype ", DataTypeName(dtype));
            ASSERT_EQ(Simulate(ranks, sizes, es), "") << what;
            const Contribution all(ranks[0].region[0].size(), 1);
            const Contribution untouched(all.size(), kUntouched);
            for (const Rank& r : ranks) {
              for (size_t e = 0; e < elems; ++e) {
                const bool in = e >= lead && e < lead + count;
                ASSERT_EQ(r.region[e], in ? all : untouched)
                    << what << ": global rank " << r.global << " element " << e;
              }
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 5000);
}

// Lanes really are taken where they fit (else the test above would pass on the leaders' path
// alone): each rank of an even layout all-reduces 1/local of the body on its own lane.
TEST(SpanPlanTest, LargeAllReducesOnEvenNodesUseEveryLane) {
  const SpanShape shape{.node_sizes = {4, 4, 4}, .node = 2, .local_rank = 3};
  const size_t count = (kSpanLaneMinBytes / 4) + 3;  // fp32, 3 left over
  auto plan =
      PlanSpanAllReduce(shape, 0, count, DataType::kFloat32, ReduceOp::kSum, kSpanLaneMinBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<SpanStep> nccl;
  for (const SpanStep& s : plan->steps) {
    if (IsNccl(s.kind)) nccl.push_back(s);
  }
  ASSERT_EQ(nccl.size(), 1u);  // local rank 3 is not a leader: no tail on lane 0
  EXPECT_EQ(nccl[0].lane, 3);
  EXPECT_TRUE(nccl[0].from_scratch);
  EXPECT_FALSE(nccl[0].to_scratch);
  EXPECT_EQ(nccl[0].offset, 3 * (count / 4) * 4);  // into its own chunk of the region
  EXPECT_EQ(nccl[0].count, count / 4);
  EXPECT_EQ(nccl[0].dtype, DataType::kFloat32);
  EXPECT_EQ(nccl[0].nccl_op, SpanNcclOp::kSum);
  EXPECT_EQ(plan->scratch_bytes, count / 4 * 4);
  // Uneven nodes: the leaders only, and only lane 0.
  const SpanShape uneven{.node_sizes = {4, 3}, .node = 0, .local_rank = 3};
  plan = PlanSpanAllReduce(uneven, 0, count, DataType::kFloat32, ReduceOp::kSum, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const SpanStep& s : plan->steps) EXPECT_FALSE(IsNccl(s.kind)) << Describe(s);
  EXPECT_FALSE(plan->uses_lane);
}

// The ops: node-local steps reduce with the op (avg: sum), NCCL with its op (avg: the sum
// premultiplied by 1/global size, so uneven nodes weigh every rank alike); integers' avg is
// refused; every step carries the call's type.
TEST(SpanPlanTest, OpsAndTypesReachEveryStep) {
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{1, 3}}) {
    for (int local = 0; local < sizes[1]; ++local) {
      const SpanShape shape{.node_sizes = sizes, .node = 1, .local_rank = local};
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                               DataType::kInt32, DataType::kInt64}) {
          auto plan = PlanSpanAllReduce(shape, 0, 1001, dtype, op, 0);
          const bool integer = dtype == DataType::kInt32 || dtype == DataType::kInt64;
          if (op == ReduceOp::kAvg && integer) {
            ASSERT_FALSE(plan.ok());
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
            EXPECT_NE(plan.status().message().find("scalar 1/4"), std::string::npos)
                << plan.status();
            continue;
          }
          ASSERT_TRUE(plan.ok()) << plan.status();
          const ReduceOp local_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
          const SpanNcclOp nccl_op = op == ReduceOp::kAvg   ? SpanNcclOp::kPreMulSumAvg
                                     : op == ReduceOp::kMin ? SpanNcclOp::kMin
                                     : op == ReduceOp::kMax ? SpanNcclOp::kMax
                                                            : SpanNcclOp::kSum;
          for (const SpanStep& s : plan->steps) {
            EXPECT_EQ(s.dtype, dtype) << Describe(s);
            if (s.kind == SpanStepKind::kLocalAllReduce ||
                s.kind == SpanStepKind::kLocalReduceScatter) {
              EXPECT_EQ(s.local_op, local_op) << Describe(s);
            }
            if (s.kind == SpanStepKind::kNcclAllReduce) {
              EXPECT_EQ(s.nccl_op, nccl_op);
            }
          }
        }
      }
    }
  }
}

// Every element of the input is read by a step that checks it for NaN/Inf.
TEST(SpanPlanTest, EveryInputElementIsCheckedOnce) {
  for (const std::vector<int>& sizes : kLayouts) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{64}}) {
      const SpanShape shape{.node_sizes = sizes, .node = 0, .local_rank = 0};
      auto plan = PlanSpanAllReduce(shape, 0, count, DataType::kFloat32, ReduceOp::kSum, 0);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<int> checked(count, 0);
      const size_t local = static_cast<size_t>(sizes[0]);
      for (const SpanStep& s : plan->steps) {
        if (!s.reads_input) continue;
        const size_t n = s.kind == SpanStepKind::kLocalReduceScatter ? s.count * local : s.count;
        for (size_t e = s.offset / 4; e < s.offset / 4 + n; ++e) ++checked[e];
      }
      for (size_t e = 0; e < count; ++e) {
        EXPECT_EQ(checked[e], 1) << "layout " << Layout(sizes) << " count " << count << " e " << e;
      }
    }
  }
}

TEST(SpanPlanTest, BroadcastGivesEveryRankTheRootsData) {
  for (const std::vector<int>& sizes : kLayouts) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{9}}) {
      int global_root = 0;
      for (size_t root_node = 0; root_node < sizes.size(); ++root_node) {
        for (int root_local = 0; root_local < sizes[root_node]; ++root_local, ++global_root) {
          std::vector<Rank> ranks = MakeRanks(sizes, count + 1, 0, count);
          for (Rank& r : ranks) {
            const SpanShape shape{.node_sizes = sizes, .node = r.node, .local_rank = r.local};
            auto plan = PlanSpanBroadcast(shape, count, DataType::kInt32,
                                          static_cast<int>(root_node), root_local);
            ASSERT_TRUE(plan.ok()) << plan.status();
            r.plan = *plan;
          }
          const std::string what =
              absl::StrCat("layout ", Layout(sizes), " count ", count, " root ", global_root);
          ASSERT_EQ(Simulate(ranks, sizes, 4), "") << what;
          Contribution want(ranks[0].region[0].size(), 0);
          want[static_cast<size_t>(global_root)] = 1;
          for (const Rank& r : ranks) {
            for (size_t e = 0; e < count; ++e) {
              ASSERT_EQ(r.region[e], want) << what << " rank " << r.global << " e " << e;
            }
            EXPECT_EQ(r.region[count][0], kUntouched) << what;
          }
        }
      }
    }
  }
}

TEST(SpanPlanTest, BarrierMeetsOnEveryRankWithoutDeadlock) {
  for (const std::vector<int>& sizes : kLayouts) {
    std::vector<Rank> ranks = MakeRanks(sizes, 1, 0, 0);
    for (Rank& r : ranks) {
      auto plan = PlanSpanBarrier({.node_sizes = sizes, .node = r.node, .local_rank = r.local});
      ASSERT_TRUE(plan.ok()) << plan.status();
      r.plan = *plan;
      r.scratch.assign(1, Contribution(r.region[0].size(), 0));
      EXPECT_GE(plan->scratch_bytes, 4u);
      EXPECT_EQ(plan->uses_lane, r.local == 0);
    }
    EXPECT_EQ(Simulate(ranks, sizes, 4), "") << Layout(sizes);
  }
}

TEST(SpanPlanTest, ShapesThatDoNotHoldTheRankAreRefused) {
  auto plan = PlanSpanAllReduce({.node_sizes = {2, 2}, .node = 2, .local_rank = 0}, 0, 8,
                                DataType::kFloat32, ReduceOp::kSum, 0);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(), "node 2 is out of range [0, 1] of the layout");
  plan = PlanSpanBarrier({.node_sizes = {2, 3}, .node = 0, .local_rank = 2});
  EXPECT_EQ(plan.status().message(), "local rank 2 is out of range [0, 1] on node 0");
  plan = PlanSpanBroadcast({.node_sizes = {2, 3}, .node = 0, .local_rank = 0}, 4,
                           DataType::kFloat32, 0, 2);
  EXPECT_EQ(plan.status().message(),
            "broadcast root (node 0, local rank 2) is not in the layout of 2 nodes");
}

}  // namespace
}  // namespace commd::kernels
