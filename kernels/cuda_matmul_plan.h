// The host-decidable logic of the fused matmuls on CUDA (all-gather + matmul, matmul +
// reduce-scatter; the GPU twin of kernels/host/fused_matmul.h): which steps go on the caller's
// stream in which order (arrival, per-peer waits, GEMMs, scales, barrier, reduction), where
// each operand lies (shard, staged row scales, workspace slots, output rows), and how a
// row-major product becomes a column-major cuBLAS call. Written once, unit-tested on every
// build (kernels/cuda_matmul_plan_test.cc); the executor (kernels/cuda/fused_matmul.cc) walks
// the steps and the kernels (kernels/cuda/fused_matmul.cu) do what one step says.
//
//   const FusedMatmulPlan plan = PlanFusedMatmul({.gather = true, .rank = 1, .world_size = 4,
//                                                 .rows = 512, .k = 1024, .element_size = 2,
//                                                 .ns = {4096}});
//   for (const FusedStep& s : plan.steps) ...   // kArrive, kGemm(1), kWait(2), kGemm(2), ...
//
// The protocol is the host path's, step for step (kernels/host/fused_matmul.cc):
//   all-gather + matmul: stage the row scales (and count NaN/Inf in the shard), arrive (this
//     shard is ready), multiply the own shard, then for each peer in ring order (rank + 1,
//     rank + 2, ...) wait for its arrival and multiply its shard where it lies; then a closing
//     barrier (no shard may change until every rank has read them all). World size 1: no
//     arrival, no waits, no barrier.
//   matmul + reduce-scatter: count NaN/Inf in A, arrive (this rank's workspace is free: it
//     finished reducing it in its previous call, stream-ordered), then for each destination
//     in ring order with its own rows last, wait for the destination's arrival (not for its
//     own) and write the fp32 partial product into slot `rank` of the destination's
//     workspace; one barrier (every partial product is in place); reduce the own slots in
//     rank order. No closing barrier: a peer writes this workspace again only after this
//     rank arrives in its next call. World size 1: the product and the reduction only.
// Nothing here needs a CUDA header or a device.
#ifndef COMMD_KERNELS_CUDA_MATMUL_PLAN_H_
#define COMMD_KERNELS_CUDA_MATMUL_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"

namespace commd::kernels {

inline constexpr size_t kFusedMaxBs = 8;           // == kMaxMatmulBs (host/fused_matmul.h)
inline constexpr size_t kFusedRowScaleAlign = 64;  // row scales after the shard, as on host
inline constexpr int kFusedSignalChannel = 0;      // the arrival and the per-peer waits

enum class FusedStepKind {
  kPrepare,  // count NaN/Inf in A and stage this shard's row scales (all-gather + matmul)
  kArrive,   // release-store this rank's arrival into every peer's slot
  kWait,     // one thread spins until `peer` has arrived (abort word, deadline)
  kGemm,     // cuBLAS: the rows of `peer` (its shard, or the destination's rows) times B `b`
  kScale,    // out rows *= row scale, columns *= col scale (and fp32 -> the output's type)
  kGather,   // copy `peer`'s shard into the caller's gathered A
  kBarrier,  // every rank: a one-block barrier on kFusedSignalChannel, fenced first
  kReduce,   // this rank's workspace slots, in rank order, into the output (sum or avg)
};

const char* FusedStepName(FusedStepKind kind);

struct FusedStep {
  FusedStepKind kind;
  int peer = -1;  // kWait: whose arrival; kGemm, kScale, kGather: whose shard / destination
  int b = 0;      // kGemm, kScale: which B
};

struct FusedMatmulShape {
  bool gather = true;  // all-gather + matmul; false: matmul + reduce-scatter
  int rank = 0;
  int world_size = 1;
  size_t rows = 0;  // gather: rows of every shard; else rows of A (world_size | rows)
  size_t k = 0;
  size_t element_size = 4;  // of A, the Bs and the outputs: 4 (fp32) or 2 (fp16, bf16)
  absl::InlinedVector<size_t, kFusedMaxBs> ns;  // columns of each B (gather: 1..8; else 1)
  bool row_scale = false;
  uint32_t col_scale_mask = 0;  // bit b: B number b has column scales
  bool gathered = false;        // gather: the caller wants the gathered A
  bool nan_check = false;
};

struct FusedMatmulPlan {
  absl::InlinedVector<FusedStep, 64> steps;
  size_t shard_bytes = 0;   // gather: one shard, at offset 0 of every data region
  size_t scale_offset = 0;  // gather: its row scales, in the same region
  size_t chunk_rows = 0;    // reduce-scatter: rows each destination receives
  size_t slot_bytes = 0;    // reduce-scatter: one source's fp32 slot in a workspace
  // fp32 scratch on the caller's stream: a 16-bit product with scales is computed in fp32
  // and scaled while converting (as the host path scales before rounding).
  size_t scratch_bytes = 0;
};

// Whether B number `b`'s products are scaled (a kScale follows each of its GEMMs), and whether
// its GEMMs write fp32 into the scratch (a scaled 16-bit all-gather + matmul output; the
// reduce-scatter's partial products are fp32 in the workspace already).
bool FusedScaled(const FusedMatmulShape& shape, int b);
bool FusedGemmToScratch(const FusedMatmulShape& shape, int b);

// What B number `b`'s GEMMs write: the call's type (an unscaled, or fp32, all-gather + matmul
// output), or fp32 (a scaled 16-bit all-gather + matmul's scratch; every matmul +
// reduce-scatter partial product). Their operands are always the call's type. The two values
// are every result type a fused GEMM has: warming cuBLAS (fused_matmul.h WarmCublas) runs one
// GEMM of each per operand type.
enum class FusedGemmOutput { kCallType, kFloat32 };
FusedGemmOutput FusedGemmOutputOf(const FusedMatmulShape& shape, int b);

// cuBLAS's recommended workspace for one stream (the cuBLAS guide, cublasSetWorkspace):
// 32 MiB on compute capability 9.0 (Hopper) and newer, 4 MiB before (0 or unknown: 4 MiB).
size_t CublasWorkspaceBytes(int compute_capability_major);

// A fused matmul's per-stream scratch: the plan's fp32 scratch from offset 0, then that
// stream's cuBLAS workspace (cublasSetWorkspace wants 256-byte alignment; cuMemAlloc's base
// has it). Without a workspace, just the plan's scratch.
inline constexpr size_t kCublasWorkspaceAlign = 256;
struct FusedScratchLayout {
  size_t workspace_offset = 0;
  size_t total_bytes = 0;
};
FusedScratchLayout LayOutFusedScratch(size_t plan_scratch_bytes, size_t workspace_bytes);

// The steps and offsets of one call; the shape is checked already (the SDK and the host
// kernels' checks: rows, k, n in [1, 2^31 - 1], world_size | rows for reduce-scatter).
FusedMatmulPlan PlanFusedMatmul(const FusedMatmulShape& shape);

// Where the output rows of shard `p` start in B number `b`'s output (gather), or where
// `rank`'s partial product starts in a destination's workspace (reduce-scatter), in bytes.
size_t GatherOutputOffset(const FusedMatmulShape& shape, int p, int b);
size_t ReduceScatterSlotOffset(const FusedMatmulShape& shape, int source);
// Byte offset of destination `d`'s first row in A (reduce-scatter).
size_t ReduceScatterRowsOffset(const FusedMatmulShape& shape, int d);

// Thread blocks of kFusedThreads for an element-wise kernel over `count` elements (scale,
// gather, reduce, the NaN/Inf scan): one element per thread up to kFusedMaxBlocks blocks
// (two waves on a 132-SM H100), grid-stride beyond; at least one block.
inline constexpr int kFusedThreads = 512;
inline constexpr int kFusedMaxBlocks = 264;
int FusedGridBlocks(size_t count);

// C (m x n) = A (m x k) @ B (k x n), all row-major with leading dimensions lda, ldb, ldc
// (elements between the starts of consecutive rows).
struct RowMajorGemm {
  size_t m = 0, n = 0, k = 0;
  size_t lda = 0, ldb = 0, ldc = 0;
};
// The same product as cuBLAS (column-major) computes it: a row-major X is X^T column-major,
// so C^T (n x m) = B^T (n x k) @ A^T (k x m): cublasGemmEx(N, N, m = n, n = m, k, first
// operand B with ld ldb, second A with ld lda, C with ld ldc).
struct CublasGemm {
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;  // of cuBLAS's first (B), second (A) and result (C)
};
// INVALID_ARGUMENT naming the dimension when one does not fit cuBLAS's int (or a leading
// dimension is below its row length).
absl::StatusOr<CublasGemm> ToCublas(const RowMajorGemm& g);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_CUDA_MATMUL_PLAN_H_
