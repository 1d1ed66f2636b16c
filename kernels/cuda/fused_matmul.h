// The fused matmuls on CUDA (the GPU twin of kernels/host/fused_matmul.h): all-gather +
// matmul and matmul + reduce-scatter over peer-mapped device memory, enqueued on the caller's
// stream as kernels/cuda_matmul_plan.h plans them: a one-thread arrival kernel (release
// stores into the peers' signal-pad slots on channel kFusedSignalChannel), per peer a
// one-thread wait kernel on that peer's slot followed by cublasGemmEx on the peer's memory
// where it lies, the row/column scale kernel, a fenced one-block barrier on the same channel,
// and the reduction kernel. Only channel kFusedSignalChannel of the signal pad is used; every
// rank makes the same arrivals on it, so its counts stay equal across ranks as the
// collectives' per-block channels do.
//
//   ASSIGN_OR_RETURN(const CublasApi* blas, Cublas(cu->driver_version));
//   RETURN_IF_ERROR(EnqueueFusedMatmul(view, args, {blas, handle, CublasWorkspaceBytes(major)},
//                                      stream, &enqueued));
//
// Asynchronous: returns once everything is enqueued. The view's error word receives a failed
// wait (aborted, timed out) as for the collectives (kernels/cuda/collectives.h); its NaN/Inf
// counter the count over A when args.nan_check is on. Operands are device memory: the Bs,
// their outputs and column scales, the row scales, the gathered A, and (reduce-scatter) A;
// all-gather + matmul's shard is at offset 0 of this rank's data region, reduce-scatter's
// workspace is the data region. Thread-compatible, like the collectives.
#ifndef COMMD_KERNELS_CUDA_FUSED_MATMUL_H_
#define COMMD_KERNELS_CUDA_FUSED_MATMUL_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda_matmul_plan.h"
#include "kernels/host/fused_matmul.h"
#include "kernels/types.h"

namespace commd::kernels {

struct CudaMatmulArgs {
  bool gather = true;  // all-gather + matmul; false: matmul + reduce-scatter
  size_t rows = 0;     // as AllGatherMatmulArgs / MatmulReduceScatterArgs
  size_t k = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;      // reduce-scatter: sum or avg
  absl::Span<const MatmulB> bs;      // gather: 1..kMaxMatmulBs; reduce-scatter: 1
  const float* row_scale = nullptr;  // rows floats, or null
  void* gathered = nullptr;          // gather: (world * rows) x k, or null
  const void* a = nullptr;           // reduce-scatter: rows x k
  NanCheck nan_check = NanCheck::kOff;
  // This stream's alone: LayOutFusedScratch(PlanFusedMatmul(FusedShapeOf(...)).scratch_bytes,
  // the CublasContext's workspace_bytes).total_bytes of device memory (the fp32 products of
  // scaled 16-bit outputs, then the stream's cuBLAS workspace).
  void* scratch = nullptr;
};

// One handle serves every stream of a group; each call sets the handle's stream and then its
// workspace, from the stream's scratch: cublasSetStream resets the workspace to cuBLAS's pool,
// which every stream of the handle would share (GEMMs on two streams at once must not).
struct CublasContext {
  const CublasApi* api = nullptr;
  cublasHandle_t handle = nullptr;  // made in the view's device's context
  size_t workspace_bytes = 0;       // per stream (CublasWorkspaceBytes); 0: cuBLAS's pool
};

// The plan's input for this call on this view.
FusedMatmulShape FusedShapeOf(const CudaCommView& view, const CudaMatmulArgs& args);

// Checks the arguments (INVALID_ARGUMENT naming the value, nothing enqueued), then enqueues
// the plan's steps on `stream`, counting each in *enqueued. A failure after the first step
// leaves the ranks' signal counts apart (the caller fails the group, as for a partial
// coalesced launch).
absl::Status EnqueueFusedMatmul(const CudaCommView& view, const CudaMatmulArgs& args,
                                const CublasContext& blas, cudaStream_t stream, int* enqueued);

// Loads the fused kernels into the current context, once per process (lazy loading would
// otherwise load one while a wait kernel spins: kernels/cuda/collectives.h).
absl::Status PreloadFusedMatmulKernels();

// Loads the cuBLAS kernels of the fused GEMMs into the current context before any of them can
// wait on a peer: one kWarmGemmDim-cubed GEMM per operand type (fp32, fp16, bf16) and result
// type (FusedGemmOutput: the operands', fp32), enqueued on `stream` over `operands`
// (kWarmCublasBytes of device memory the caller keeps until they ran), on cuBLAS's own
// workspace pool. With lazy loading (CUDA 12.2's default) the first launch of a kernel loads
// it and may wait for the context; the group's handle is warmed when it is made, before any of
// its arrivals or waits is enqueued. cuBLAS may still pick another kernel for a product of
// another shape: CUDA_MODULE_LOADING=EAGER loads everything at start (docs/operations.md).
// Returns the first GEMM's failure, INTERNAL naming it.
inline constexpr int kWarmGemmDim = 64;
inline constexpr size_t kWarmCublasBytes = 3 * sizeof(float) * kWarmGemmDim * kWarmGemmDim;
absl::Status WarmCublas(const CublasContext& blas, void* operands, cudaStream_t stream);

namespace cuda_internal {

// One kernel step (every FusedStepKind but kGemm), its pointers resolved.
struct FusedLaunchArgs {
  FusedStepKind kind = FusedStepKind::kArrive;
  DataType dtype = DataType::kFloat32;  // prepare: A's; scale, reduce: the destination's
  ReduceOp op = ReduceOp::kSum;         // reduce
  int peer = -1;                        // wait
  const void* src = nullptr;            // prepare: A; scale: the fp32 product; gather: the shard;
                                        // reduce: slot 0 of this rank's workspace (fp32)
  void* dst = nullptr;                  // scale, gather, reduce
  size_t count = 0;                     // prepare: A's elements to scan (0: none); gather: bytes;
                                        // reduce: elements of a slot; scale: rows * cols
  size_t cols = 0;                      // scale
  const float* row_scale = nullptr;     // scale: per row, or null; prepare: to stage, or null
  const float* col_scale = nullptr;     // scale: per column, or null
  float* staged_scale = nullptr;        // prepare: where the row scales go
  size_t scale_rows = 0;                // prepare: how many
};

// The boundary with the CUDA runtime for these kernels, replaced by tests of the host side
// (as KernelRuntime in collectives.h).
struct FusedKernelRuntime {
  cudaError_t (*launch)(const CudaCommView& view, const FusedLaunchArgs& args, cudaStream_t stream);
  cudaError_t (*preload)();
};
// Null restores the real one. Not thread-safe against launches: set it before any.
void SetFusedKernelRuntimeForTesting(const FusedKernelRuntime* runtime);

// Defined in fused_matmul.cu.
cudaError_t LaunchFusedKernel(const CudaCommView& view, const FusedLaunchArgs& args,
                              cudaStream_t stream);
cudaError_t PreloadFusedKernels();

}  // namespace cuda_internal
}  // namespace commd::kernels

#endif  // COMMD_KERNELS_CUDA_FUSED_MATMUL_H_
