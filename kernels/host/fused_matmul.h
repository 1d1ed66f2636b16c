// Fused compute and communication over symmetric host memory (async tensor parallelism):
// all-gather + matmul, and matmul + reduce-scatter. The matmuls are OpenBLAS's sgemm
// (accumulating in fp32); fp16 and bf16 operands are converted to fp32 in cache-sized blocks.
//
//   // A's rows are sharded: this rank's shard (rows x k) is at the start of its data region.
//   MatmulB b{.data = w, .n = 4096, .out = y};   // y = allgather(A) @ w, (world*rows) x n
//   RETURN_IF_ERROR(AllGatherMatmul(view, {.rows = 512, .k = 1024, .dtype = kFloat32,
//                                          .bs = {&b, 1}}, NanCheck::kOff, &result));
//
// Both take part in the call check of the other collectives (kernels/host/call_check.h) and
// wait with HostBarrier's rules (abort word, deadline and wait limit, futex sleeps).
#ifndef COMMD_KERNELS_HOST_FUSED_MATMUL_H_
#define COMMD_KERNELS_HOST_FUSED_MATMUL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd::kernels {

// At most this many Bs per all-gather + matmul (the call check digests their widths).
inline constexpr size_t kMaxMatmulBs = 8;

// One right-hand matrix of a fused matmul and its output, row-major, in the call's type.
struct MatmulB {
  const void* data = nullptr;        // k x n
  size_t n = 0;                      // columns, > 0
  void* out = nullptr;               // AllGatherMatmul: (world * rows) x n; MatmulReduceScatter:
                                     // (rows / world) x n
  const float* col_scale = nullptr;  // n scales: out[i][j] *= col_scale[j]; null: none
};

struct AllGatherMatmulArgs {
  size_t rows = 0;  // rows of every rank's shard (leading dimensions flattened), > 0
  size_t k = 0;     // > 0
  DataType dtype = DataType::kFloat32;  // of A, every B and every output: fp32, fp16, bf16
  absl::Span<const MatmulB> bs;         // 1..kMaxMatmulBs
  // This shard's row scales (rows floats): output row r of shard p is multiplied by shard p's
  // scale r. Staged after the shard in the data region, so the peers read them there.
  const float* row_scale = nullptr;
  void* gathered = nullptr;  // (world * rows) x k: the gathered A, only when not null
};

// outs = allgather(A) @ B for every B. The shard must be in place at offset 0 of this rank's
// data region (with room after it, 64-byte aligned, for the row scales). Each rank multiplies
// its own shard first, before waiting for anyone, then each peer's shard where it lies, in
// ring order (rank + 1, rank + 2, ...), as soon as that peer has arrived. Nothing is gathered
// unless `gathered` is set. `result` may be null.
absl::Status AllGatherMatmul(const HostCommView& view, const AllGatherMatmulArgs& args,
                             NanCheck nan_check, CollectiveResult* result);

struct MatmulReduceScatterArgs {
  const void* a = nullptr;  // rows x k, this rank's local A
  size_t rows = 0;          // divisible by the world size, > 0
  size_t k = 0;             // > 0
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;      // sum or avg
  MatmulB b;                         // b.out: this rank's (rows / world) x n rows of the result
  const float* row_scale = nullptr;  // rows scales of A's rows, or null
};

// out = rows [rank * rows / world, ...) of the sum (or average) over ranks of A @ B. Each rank
// multiplies the rows of each destination (ring order, its own last) and sgemm writes the
// fp32 partial product straight into that destination's data region (slot = this rank), as
// soon as the destination has arrived; each destination then reduces its slots in rank
// order. The data region must hold world * (rows / world) * n floats.
absl::Status MatmulReduceScatter(const HostCommView& view, const MatmulReduceScatterArgs& args,
                                 NanCheck nan_check, CollectiveResult* result);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_FUSED_MATMUL_H_
