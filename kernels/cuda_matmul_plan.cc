#include "kernels/cuda_matmul_plan.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"

namespace commd::kernels {
namespace {

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

void AddProduct(const FusedMatmulShape& s, int p, FusedMatmulPlan& plan) {
  const int bs = s.gather ? static_cast<int>(s.ns.size()) : 1;
  for (int b = 0; b < bs; ++b) {
    plan.steps.push_back({FusedStepKind::kGemm, p, b});
    if (FusedScaled(s, b)) plan.steps.push_back({FusedStepKind::kScale, p, b});
  }
  if (s.gather && s.gathered) plan.steps.push_back({FusedStepKind::kGather, p, 0});
}

}  // namespace

const char* FusedStepName(FusedStepKind kind) {
  switch (kind) {
    case FusedStepKind::kPrepare:
      return "prepare";
    case FusedStepKind::kArrive:
      return "arrive";
    case FusedStepKind::kWait:
      return "wait";
    case FusedStepKind::kGemm:
      return "gemm";
    case FusedStepKind::kScale:
      return "scale";
    case FusedStepKind::kGather:
      return "gather";
    case FusedStepKind::kBarrier:
      return "barrier";
    case FusedStepKind::kReduce:
      return "reduce";
  }
  return "unknown";
}

bool FusedScaled(const FusedMatmulShape& s, int b) {
  return s.row_scale || (s.col_scale_mask >> b & 1u) != 0;
}

bool FusedGemmToScratch(const FusedMatmulShape& s, int b) {
  return s.gather && s.element_size != sizeof(float) && FusedScaled(s, b);
}

FusedGemmOutput FusedGemmOutputOf(const FusedMatmulShape& s, int b) {
  return !s.gather || FusedGemmToScratch(s, b) ? FusedGemmOutput::kFloat32
                                               : FusedGemmOutput::kCallType;
}

size_t CublasWorkspaceBytes(int compute_capability_major) {
  return (compute_capability_major >= 9 ? size_t{32} : size_t{4}) << 20;
}

FusedScratchLayout LayOutFusedScratch(size_t plan_scratch_bytes, size_t workspace_bytes) {
  if (workspace_bytes == 0) return {0, plan_scratch_bytes};
  const size_t offset = AlignUp(plan_scratch_bytes, kCublasWorkspaceAlign);
  return {offset, offset + workspace_bytes};
}

FusedMatmulPlan PlanFusedMatmul(const FusedMatmulShape& s) {
  FusedMatmulPlan plan;
  const int w = s.world_size;
  const bool staged_scales = s.gather && s.row_scale;
  if (s.nan_check || staged_scales) plan.steps.push_back({FusedStepKind::kPrepare});
  if (s.gather) {
    plan.shard_bytes = s.rows * s.k * s.element_size;
    plan.scale_offset = AlignUp(plan.shard_bytes, kFusedRowScaleAlign);
    for (size_t b = 0; b < s.ns.size(); ++b) {
      if (FusedGemmToScratch(s, static_cast<int>(b))) {
        plan.scratch_bytes = std::max(plan.scratch_bytes, s.rows * s.ns[b] * sizeof(float));
      }
    }
    if (w > 1) plan.steps.push_back({FusedStepKind::kArrive});
    AddProduct(s, s.rank, plan);  // overlaps the peers' arrival
    for (int i = 1; i < w; ++i) {
      const int p = (s.rank + i) % w;
      plan.steps.push_back({FusedStepKind::kWait, p});
      AddProduct(s, p, plan);
    }
    if (w > 1) plan.steps.push_back({FusedStepKind::kBarrier});
    return plan;
  }
  plan.chunk_rows = s.rows / static_cast<size_t>(w);
  plan.slot_bytes = plan.chunk_rows * s.ns[0] * sizeof(float);
  if (w > 1) plan.steps.push_back({FusedStepKind::kArrive});
  for (int i = 1; i <= w; ++i) {
    const int d = (s.rank + i) % w;
    if (d != s.rank) plan.steps.push_back({FusedStepKind::kWait, d});
    AddProduct(s, d, plan);
  }
  if (w > 1) plan.steps.push_back({FusedStepKind::kBarrier});
  plan.steps.push_back({FusedStepKind::kReduce, s.rank});
  return plan;
}

int FusedGridBlocks(size_t count) {
  const size_t blocks = (count + kFusedThreads - 1) / kFusedThreads;
  return static_cast<int>(std::clamp<size_t>(blocks, 1, kFusedMaxBlocks));
}

size_t GatherOutputOffset(const FusedMatmulShape& s, int p, int b) {
  return static_cast<size_t>(p) * s.rows * s.ns[static_cast<size_t>(b)] * s.element_size;
}

size_t ReduceScatterSlotOffset(const FusedMatmulShape& s, int source) {
  const size_t chunk = s.rows / static_cast<size_t>(s.world_size);
  return static_cast<size_t>(source) * chunk * s.ns[0] * sizeof(float);
}

size_t ReduceScatterRowsOffset(const FusedMatmulShape& s, int d) {
  const size_t chunk = s.rows / static_cast<size_t>(s.world_size);
  return static_cast<size_t>(d) * chunk * s.k * s.element_size;
}

absl::StatusOr<CublasGemm> ToCublas(const RowMajorGemm& g) {
  constexpr size_t kMax = INT_MAX;
  const struct {
    const char* name;
    size_t value;
    size_t min;
  } dims[] = {{"m", g.m, 1},       {"n", g.n, 1},       {"k", g.k, 1},
              {"lda", g.lda, g.k}, {"ldb", g.ldb, g.n}, {"ldc", g.ldc, g.n}};
  for (const auto& d : dims) {
    if (d.value < d.min || d.value > kMax) {
      return absl::InvalidArgumentError(absl::StrCat("cuBLAS GEMM: ", d.name, " ", d.value,
                                                     " is out of range [", d.min, ", ", kMax,
                                                     "] (cuBLAS takes int dimensions)"));
    }
  }
  return CublasGemm{.m = static_cast<int>(g.n),
                    .n = static_cast<int>(g.m),
                    .k = static_cast<int>(g.k),
                    .lda = static_cast<int>(g.ldb),
                    .ldb = static_cast<int>(g.lda),
                    .ldc = static_cast<int>(g.ldc)};
}

}  // namespace commd::kernels
