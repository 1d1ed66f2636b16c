// CUDA kernels of the fused matmuls (kernels/cuda/fused_matmul.h): the one-thread arrival and
// wait on the signal pad, and the element-wise steps around cuBLAS's GEMMs.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_sync.cuh"
#include "kernels/cuda/fused_matmul.h"
#include "kernels/element_ops.h"

namespace commd::kernels::cuda_internal {
namespace {

using cuda_device::LoadAcquire;
using cuda_device::LoadVolatile;
using cuda_device::StoreRelease;
using cuda_device::WaitForSlot;

__device__ size_t GlobalThread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ size_t GridThreads() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

// Whether an earlier wait of this group already failed (the error word is sticky: the group
// fails for good at its next call). A call's later waits then end at once instead of each
// spending the whole deadline on a peer that is not coming.
__device__ bool GroupFailed(const CudaCommView& v) {
  return v.error_word != nullptr && LoadVolatile(v.error_word) != 0;
}

// This rank's arrival on kFusedSignalChannel: its count there grows by one and reaches every
// peer's slot for it. One block; thread p stores into peer p's pad.
//
// Ordering: what this rank wrote before (the caller's kernels filling the shard, the prepare
// kernel's staged scales, the previous call's reduction reading the workspace) was done by
// earlier kernels on the stream, by other threads. Stream order makes those kernels complete
// first; the fence.sc.sys of __threadfence_system then orders everything this thread observes
// before the release stores at system scope, for peers on other GPUs that acquire them (one
// fence per call, not per element). PyTorch's symmetric-memory put_signal does the same
// (release at system scope after the producing kernel finished on the stream).
__global__ void ArriveKernel(CudaCommView v) {
  __shared__ uint32_t seq;
  const int w = v.world_size;
  if (threadIdx.x == 0) {
    __threadfence_system();
    uint32_t* own = v.pads[v.rank] + PadSlot(kFusedSignalChannel, v.rank, w);
    seq = *own + 1;
    *own = seq;
  }
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < w && peer != v.rank) {
    StoreRelease(v.pads[peer] + PadSlot(kFusedSignalChannel, v.rank, w), seq);
  }
}

// The barrier of the fused path: block 0's BlockBarrier, so on channel 0 ==
// kFusedSignalChannel, after a system-scope fence. The fence is for what earlier kernels on
// the stream wrote into peers' memory (cuBLAS's partial products in a destination's
// workspace, the scale kernel) or read from it: those were other threads' accesses, ordered
// before this kernel by the stream, and the fence makes the arrival's release cover them for
// the peers (as the arrival does). One block of kCudaMaxWorldSize threads (one per peer).
__global__ void FencedBarrierKernel(CudaCommView v) {
  static_assert(kFusedSignalChannel == 0, "BlockBarrier of block 0 uses channel 0");
  __shared__ int failed;  // one read for the block, so every thread takes the same branch
  if (threadIdx.x == 0) {
    failed = GroupFailed(v) ? 1 : 0;
    if (failed == 0) __threadfence_system();
  }
  __syncthreads();
  if (failed != 0) return;
  cuda_device::BlockBarrier(v);
}

// One thread waits until `peer` has made the arrival this rank made last (its own count on
// the channel, written by ArriveKernel before, stream-ordered). The acquire load orders the
// peer's data before this kernel's end; the GEMM after it on the stream starts only then.
// A failed wait (abort, deadline) sets the error word; the group fails at its next call.
__global__ void WaitKernel(CudaCommView v, int peer) {
  if (GroupFailed(v)) return;
  const int w = v.world_size;
  const uint32_t seq = LoadAcquire(v.pads[v.rank] + PadSlot(kFusedSignalChannel, v.rank, w));
  WaitForSlot(v, v.pads[v.rank] + PadSlot(kFusedSignalChannel, peer, w), seq, peer);
}

// The sum of `x` over the block, in thread 0 (the other threads' results are partial): a
// shuffle tree in each warp, then warp 0 sums the warps' totals from shared memory. Every
// thread of the block must call it (it synchronises the block).
static_assert(kFusedThreads % 32 == 0 && kFusedThreads <= 32 * 32,
              "BlockSum: whole warps, at most one warp's worth of them");
__device__ unsigned long long BlockSum(unsigned long long x) {
  __shared__ unsigned long long warp_sums[kFusedThreads / 32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp != 0) return 0;
  x = lane < blockDim.x / 32 ? warp_sums[lane] : 0;
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
  return x;
}

// Counts NaN/Inf in A (count elements) into the call's counter, and stages the row scales.
// The counter is pinned host memory: one atomic per block (after BlockSum), not per thread,
// as the collectives' copy-in does (collectives.cu CopyInRange).
template <typename T>
__global__ void __launch_bounds__(kFusedThreads) PrepareKernel(CudaCommView v, FusedLaunchArgs a) {
  const T* in = static_cast<const T*>(a.src);
  unsigned long long bad = 0;
  for (size_t i = GlobalThread(); i < a.count; i += GridThreads()) {
    bad += IsNonFinite(in[i]) ? 1 : 0;
  }
  if (a.count != 0 && v.nonfinite_count != nullptr) {  // the same for the whole block
    bad = BlockSum(bad);
    if (threadIdx.x == 0 && bad != 0) atomicAdd(v.nonfinite_count, bad);
  }
  if (a.row_scale != nullptr) {
    for (size_t i = GlobalThread(); i < a.scale_rows; i += GridThreads()) {
      a.staged_scale[i] = a.row_scale[i];
    }
  }
}

// dst[r][c] = src[r][c] * (row_scale[r] * col_scale[c]), in fp32, then the destination's
// type: the host path's order (kernels/host/fused_matmul.cc Gemm then FromFloat).
template <typename T>
__global__ void ScaleKernel(FusedLaunchArgs a) {
  const float* src = static_cast<const float*>(a.src);
  T* dst = static_cast<T*>(a.dst);
  for (size_t i = GlobalThread(); i < a.count; i += GridThreads()) {
    const size_t r = i / a.cols, c = i % a.cols;
    const float rs = a.row_scale != nullptr ? a.row_scale[r] : 1.0f;
    const float f = a.col_scale != nullptr ? rs * a.col_scale[c] : rs;
    dst[i] = FromAcc<T>(src[i] * f);
  }
}

// The gathered A: count bytes of a peer's shard, 16 bytes at a time when everything allows.
__global__ void GatherKernel(FusedLaunchArgs a) {
  const bool vec = reinterpret_cast<uintptr_t>(a.src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.dst) % 16 == 0 && a.count % 16 == 0;
  if (vec) {
    const uint4* src = static_cast<const uint4*>(a.src);
    uint4* dst = static_cast<uint4*>(a.dst);
    for (size_t i = GlobalThread(); i < a.count / 16; i += GridThreads()) dst[i] = src[i];
    return;
  }
  const auto* src = static_cast<const unsigned char*>(a.src);
  auto* dst = static_cast<unsigned char*>(a.dst);
  for (size_t i = GlobalThread(); i < a.count; i += GridThreads()) dst[i] = src[i];
}

// dst[i] = the world_size fp32 slots' element i combined in rank order (element_ops.h, as
// the host path's ReduceInto), finalised (avg divides), converted to T.
template <typename T, ReduceOp Op>
__global__ void ReduceKernel(FusedLaunchArgs a, int world_size) {
  const float* src = static_cast<const float*>(a.src);
  T* dst = static_cast<T*>(a.dst);
  for (size_t i = GlobalThread(); i < a.count; i += GridThreads()) {
    float acc = src[i];
    for (int p = 1; p < world_size; ++p) acc = Combine<Op>(acc, src[p * a.count + i]);
    dst[i] = FromAcc<T>(Finalize<Op>(acc, world_size));
  }
}

template <typename T>
void LaunchTyped(const CudaCommView& v, const FusedLaunchArgs& a, cudaStream_t s) {
  const int threads = kFusedThreads;
  switch (a.kind) {
    case FusedStepKind::kPrepare:
      return PrepareKernel<T>
          <<<FusedGridBlocks(a.count > a.scale_rows ? a.count : a.scale_rows), threads, 0, s>>>(v,
                                                                                                a);
    case FusedStepKind::kScale:
      return ScaleKernel<T><<<FusedGridBlocks(a.count), threads, 0, s>>>(a);
    case FusedStepKind::kReduce:
      if (a.op == ReduceOp::kAvg) {
        return ReduceKernel<T, ReduceOp::kAvg>
            <<<FusedGridBlocks(a.count), threads, 0, s>>>(a, v.world_size);
      }
      return ReduceKernel<T, ReduceOp::kSum>
          <<<FusedGridBlocks(a.count), threads, 0, s>>>(a, v.world_size);
    default:
      return;
  }
}

template <typename T>
cudaError_t PreloadTyped() {
  cudaFuncAttributes attr;
  for (const void* f : {reinterpret_cast<const void*>(&PrepareKernel<T>),
                        reinterpret_cast<const void*>(&ScaleKernel<T>),
                        reinterpret_cast<const void*>(&ReduceKernel<T, ReduceOp::kSum>),
                        reinterpret_cast<const void*>(&ReduceKernel<T, ReduceOp::kAvg>)}) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attr, f); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchFusedKernel(const CudaCommView& v, const FusedLaunchArgs& a, cudaStream_t s) {
  switch (a.kind) {
    case FusedStepKind::kArrive:
      ArriveKernel<<<1, kCudaMaxWorldSize, 0, s>>>(v);
      return cudaGetLastError();
    case FusedStepKind::kWait:
      WaitKernel<<<1, 1, 0, s>>>(v, a.peer);
      return cudaGetLastError();
    case FusedStepKind::kBarrier:
      FencedBarrierKernel<<<1, kCudaMaxWorldSize, 0, s>>>(v);
      return cudaGetLastError();
    case FusedStepKind::kGather:
      GatherKernel<<<FusedGridBlocks(a.count / 16 + 1), kFusedThreads, 0, s>>>(a);
      return cudaGetLastError();
    default:
      break;
  }
  switch (a.dtype) {
    case DataType::kFloat32:
      LaunchTyped<float>(v, a, s);
      break;
    case DataType::kFloat16:
      LaunchTyped<Half>(v, a, s);
      break;
    case DataType::kBFloat16:
      LaunchTyped<BFloat16>(v, a, s);
      break;
    default:
      return cudaErrorInvalidValue;  // the executor passes no other
  }
  return cudaGetLastError();
}

cudaError_t PreloadFusedKernels() {
  cudaFuncAttributes attr;
  for (const void* f :
       {reinterpret_cast<const void*>(&ArriveKernel), reinterpret_cast<const void*>(&WaitKernel),
        reinterpret_cast<const void*>(&FencedBarrierKernel),
        reinterpret_cast<const void*>(&GatherKernel)}) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attr, f); err != cudaSuccess) return err;
  }
  for (cudaError_t err : {PreloadTyped<float>(), PreloadTyped<Half>(), PreloadTyped<BFloat16>()}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace commd::kernels::cuda_internal
