// The fused matmuls' CUDA plan (kernels/cuda_matmul_plan.h) over world sizes 1 to 8 and every
// rank: the step order is the host path's protocol (kernels/host/fused_matmul.cc), each
// peer's GEMM comes only after its wait, the own shard first (all-gather) or last
// (reduce-scatter), ring order in between; offsets, scratch and the column-major mapping.
#include "kernels/cuda_matmul_plan.h"

#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

using K = FusedStepKind;

std::string Text(const FusedMatmulPlan& plan) {
  std::string out;
  for (const FusedStep& s : plan.steps) {
    out += FusedStepName(s.kind);
    if (s.peer >= 0)
      out += "(" + std::to_string(s.peer) + (s.b ? "," + std::to_string(s.b) : "") + ")";
    out += " ";
  }
  return out;
}

TEST(CudaMatmulPlanTest, AllGatherMatmulOfRankOneInFourIsTheHostProtocol) {
  FusedMatmulShape s{
      .gather = true, .rank = 1, .world_size = 4, .rows = 3, .k = 5, .element_size = 4, .ns = {7}};
  EXPECT_EQ(Text(PlanFusedMatmul(s)),
            "arrive gemm(1) wait(2) gemm(2) wait(3) gemm(3) wait(0) gemm(0) barrier ");
  s.row_scale = true;
  s.gathered = true;
  s.ns = {7, 9};
  s.col_scale_mask = 0b10;
  EXPECT_EQ(Text(PlanFusedMatmul(s)),
            "prepare arrive gemm(1) scale(1) gemm(1,1) scale(1,1) gather(1) wait(2) gemm(2) "
            "scale(2) gemm(2,1) scale(2,1) gather(2) wait(3) gemm(3) scale(3) gemm(3,1) "
            "scale(3,1) gather(3) wait(0) gemm(0) scale(0) gemm(0,1) scale(0,1) gather(0) "
            "barrier ");
}

TEST(CudaMatmulPlanTest, MatmulReduceScatterOfRankOneInThreeIsTheHostProtocol) {
  FusedMatmulShape s{.gather = false,
                     .rank = 1,
                     .world_size = 3,
                     .rows = 6,
                     .k = 5,
                     .element_size = 2,
                     .ns = {7},
                     .nan_check = true};
  // No wait for its own rows; one barrier before the reduction and none after it.
  EXPECT_EQ(Text(PlanFusedMatmul(s)),
            "prepare arrive wait(2) gemm(2) wait(0) gemm(0) gemm(1) barrier reduce(1) ");
}

TEST(CudaMatmulPlanTest, WorldOfOneHasNoArrivalWaitOrBarrier) {
  FusedMatmulShape g{
      .gather = true, .rank = 0, .world_size = 1, .rows = 2, .k = 2, .element_size = 4, .ns = {3}};
  EXPECT_EQ(Text(PlanFusedMatmul(g)), "gemm(0) ");
  FusedMatmulShape r = g;
  r.gather = false;
  EXPECT_EQ(Text(PlanFusedMatmul(r)), "gemm(0) reduce(0) ");
}

// Every rank of every world size: one arrival before any wait, each peer waited for exactly
// once and before every step on its rows, the own rows without a wait, ring order.
class CudaMatmulOrderTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(CudaMatmulOrderTest, EachPeersRowsOnlyAfterItsWaitInRingOrder) {
  const auto [gather, world] = GetParam();
  for (int rank = 0; rank < world; ++rank) {
    FusedMatmulShape s{.gather = gather,
                       .rank = rank,
                       .world_size = world,
                       .rows = static_cast<size_t>(world) * 2,
                       .k = 3,
                       .element_size = 2,
                       .ns = {5},
                       .row_scale = true,
                       .gathered = gather};
    const FusedMatmulPlan plan = PlanFusedMatmul(s);
    std::vector<int> waited(static_cast<size_t>(world), 0);
    std::vector<int> order;  // whose rows, in the order first touched
    bool arrived = world == 1, barrier = false;
    for (const FusedStep& st : plan.steps) {
      SCOPED_TRACE(Text(plan));
      if (st.kind == K::kArrive) arrived = true;
      if (st.kind == K::kWait) {
        EXPECT_TRUE(arrived) << "a wait before the arrival";
        EXPECT_NE(st.peer, rank) << "a rank waits for itself";
        ++waited[static_cast<size_t>(st.peer)];
      }
      if (st.kind == K::kGemm || st.kind == K::kScale || st.kind == K::kGather) {
        EXPECT_FALSE(barrier) << "rows touched after the barrier";
        if (st.peer != rank) {
          EXPECT_EQ(waited[static_cast<size_t>(st.peer)], 1) << st.peer;
        }
        if (order.empty() || order.back() != st.peer) order.push_back(st.peer);
      }
      if (st.kind == K::kBarrier) barrier = true;
    }
    std::vector<int> expected;
    for (int i = gather ? 0 : 1; i < (gather ? world : world + 1); ++i) {
      expected.push_back((rank + i) % world);
    }
    EXPECT_EQ(order, expected) << "rank " << rank;
    for (int p = 0; p < world; ++p) EXPECT_EQ(waited[static_cast<size_t>(p)], p == rank ? 0 : 1);
    EXPECT_EQ(barrier, world > 1);
    EXPECT_EQ(plan.steps.back().kind, world == 1 ? (gather ? K::kGather : K::kReduce)
                                                 : (gather ? K::kBarrier : K::kReduce));
  }
}

INSTANTIATE_TEST_SUITE_P(GatherAndScatterBy1To8Ranks, CudaMatmulOrderTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Range(1, 9)));

TEST(CudaMatmulPlanTest, OffsetsAndScratch) {
  // 3-D A of 2 x 3 rows flattened to 6, bf16: the shard is 6 x 5 x 2 = 60 bytes, its row
  // scales start at 64.
  FusedMatmulShape g{.gather = true,
                     .rank = 2,
                     .world_size = 4,
                     .rows = 6,
                     .k = 5,
                     .element_size = 2,
                     .ns = {7, 3},
                     .row_scale = true};
  const FusedMatmulPlan p = PlanFusedMatmul(g);
  EXPECT_EQ(p.shard_bytes, 60u);
  EXPECT_EQ(p.scale_offset, 64u);
  EXPECT_EQ(p.scratch_bytes, 6u * 7 * 4);  // the widest scaled B's shard product in fp32
  EXPECT_EQ(GatherOutputOffset(g, 3, 0), 3u * 6 * 7 * 2);
  EXPECT_EQ(GatherOutputOffset(g, 3, 1), 3u * 6 * 3 * 2);
  EXPECT_TRUE(FusedGemmToScratch(g, 1));
  g.element_size = 4;  // fp32 is scaled in place in the output
  EXPECT_FALSE(FusedGemmToScratch(g, 0));
  EXPECT_EQ(PlanFusedMatmul(g).scratch_bytes, 0u);
  g.element_size = 2;
  g.row_scale = false;  // unscaled 16-bit: cuBLAS writes the output type directly
  EXPECT_FALSE(FusedScaled(g, 0));
  EXPECT_EQ(PlanFusedMatmul(g).scratch_bytes, 0u);

  FusedMatmulShape r{
      .gather = false, .rank = 1, .world_size = 4, .rows = 8, .k = 5, .element_size = 2, .ns = {3}};
  const FusedMatmulPlan q = PlanFusedMatmul(r);
  EXPECT_EQ(q.chunk_rows, 2u);
  EXPECT_EQ(q.slot_bytes, 2u * 3 * 4);
  EXPECT_EQ(ReduceScatterSlotOffset(r, 3), 3u * 2 * 3 * 4);
  EXPECT_EQ(ReduceScatterRowsOffset(r, 2), 2u * 2 * 5 * 2);
  EXPECT_EQ(q.scratch_bytes, 0u);  // partial products are fp32 in the workspace
}

// Every GEMM's result type is one of the two FusedGemmOutput values, as the executor writes
// it: fp32 for reduce-scatter's partial products and scaled 16-bit all-gather outputs (the
// scratch), the call's type otherwise. (WarmCublas runs one GEMM per type and value.)
TEST(CudaMatmulPlanTest, GemmOutputTypes) {
  FusedMatmulShape s{.gather = true, .rows = 3, .k = 5, .element_size = 2, .ns = {7, 9}};
  EXPECT_EQ(FusedGemmOutputOf(s, 0), FusedGemmOutput::kCallType);
  s.col_scale_mask = 0b10;
  EXPECT_EQ(FusedGemmOutputOf(s, 0), FusedGemmOutput::kCallType);
  EXPECT_EQ(FusedGemmOutputOf(s, 1), FusedGemmOutput::kFloat32);
  s.row_scale = true;
  EXPECT_EQ(FusedGemmOutputOf(s, 0), FusedGemmOutput::kFloat32);
  s.element_size = 4;  // fp32 scaled in place: the call's type, which is fp32
  EXPECT_EQ(FusedGemmOutputOf(s, 0), FusedGemmOutput::kCallType);
  s.gather = false;
  s.ns = {7};
  for (size_t e : {2, 4}) {
    s.element_size = e;
    s.row_scale = false;
    s.col_scale_mask = 0;
    EXPECT_EQ(FusedGemmOutputOf(s, 0), FusedGemmOutput::kFloat32) << e;
  }
}

// Issue #36 fix 5: each stream's cuBLAS workspace lies in its scratch, after the plan's fp32
// scratch, 256-byte aligned, of cuBLAS's recommended size.
TEST(CudaMatmulPlanTest, CublasWorkspaceFollowsThePlansScratch) {
  EXPECT_EQ(CublasWorkspaceBytes(0), size_t{4} << 20);
  EXPECT_EQ(CublasWorkspaceBytes(8), size_t{4} << 20);
  EXPECT_EQ(CublasWorkspaceBytes(9), size_t{32} << 20);
  EXPECT_EQ(CublasWorkspaceBytes(10), size_t{32} << 20);
  const FusedScratchLayout none = LayOutFusedScratch(1000, 0);
  EXPECT_EQ(none.total_bytes, 1000u);
  const FusedScratchLayout only = LayOutFusedScratch(0, 4096);
  EXPECT_EQ(only.workspace_offset, 0u);
  EXPECT_EQ(only.total_bytes, 4096u);
  const FusedScratchLayout both = LayOutFusedScratch(1000, 4096);
  EXPECT_EQ(both.workspace_offset, 1024u);
  EXPECT_EQ(both.workspace_offset % kCublasWorkspaceAlign, 0u);
  EXPECT_EQ(both.total_bytes, 1024u + 4096u);
}

TEST(CudaMatmulPlanTest, GridCoversTheElementsUpToItsCap) {
  EXPECT_EQ(FusedGridBlocks(0), 1);
  EXPECT_EQ(FusedGridBlocks(1), 1);
  EXPECT_EQ(FusedGridBlocks(kFusedThreads), 1);
  EXPECT_EQ(FusedGridBlocks(kFusedThreads + 1), 2);
  EXPECT_EQ(FusedGridBlocks(size_t{1} << 40), kFusedMaxBlocks);
}

TEST(CudaMatmulPlanTest, RowMajorProductIsTheTransposedColumnMajorOne) {
  // C (m x n) = A (m x k) @ B (k x n), packed: cuBLAS computes C^T = B^T A^T, so its m is
  // our n, its n our m, its first operand B (ld n) and its second A (ld k).
  auto c = ToCublas({.m = 6, .n = 7, .k = 5, .lda = 5, .ldb = 7, .ldc = 7});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->m, 7);
  EXPECT_EQ(c->n, 6);
  EXPECT_EQ(c->k, 5);
  EXPECT_EQ(c->lda, 7);
  EXPECT_EQ(c->ldb, 5);
  EXPECT_EQ(c->ldc, 7);

  // Check the mapping numerically: a column-major GEMM on those arguments gives row-major C.
  const int m = 2, n = 3, k = 4;
  std::vector<float> a(m * k), b(k * n), col_c(m * n), want(m * n);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>(i + 1);
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>(2 * i - 3);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int l = 0; l < k; ++l) want[i * n + j] += a[i * k + l] * b[l * n + j];
    }
  }
  auto g = ToCublas({.m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n});
  ASSERT_TRUE(g.ok());
  // Column-major: C(i, j) at c[i + j * ldc], first(i, l) at x[i + l * lda], second(l, j) at
  // y[l + j * ldb], x = B, y = A.
  for (int i = 0; i < g->m; ++i) {
    for (int j = 0; j < g->n; ++j) {
      float acc = 0;
      for (int l = 0; l < g->k; ++l) acc += b[i + l * g->lda] * a[l + j * g->ldb];
      col_c[i + j * g->ldc] = acc;
    }
  }
  EXPECT_EQ(col_c, want);
}

TEST(CudaMatmulPlanTest, DimensionsBeyondIntAreRefusedByName) {
  auto big = ToCublas({.m = size_t{1} << 31, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2});
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(big.status()));
  EXPECT_NE(big.status().message().find("m 2147483648 is out of range"), std::string::npos)
      << big.status();
  auto ld = ToCublas({.m = 2, .n = 4, .k = 2, .lda = 2, .ldb = 3, .ldc = 4});
  ASSERT_FALSE(ld.ok());
  EXPECT_NE(ld.status().message().find("ldb 3"), std::string::npos) << ld.status();
}

}  // namespace
}  // namespace commd::kernels
