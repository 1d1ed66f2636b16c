// CUDA kernels of the collectives. Every launch runs kCudaBlocks blocks; block b handles the
// same elements on every rank and synchronises with its peers' block b on pad channel b.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/algorithm.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/device_sync.cuh"
#include "kernels/cuda_plan.h"
#include "kernels/element_ops.h"

namespace commd::kernels::cuda_internal {
namespace {

using cuda_device::BlockBarrier;

template <typename T>
inline constexpr size_t kPack = 16 / sizeof(T);  // elements per 16-byte vector access

template <typename T>
struct alignas(16) PackOf {
  T v[kPack<T>];
};

// Calls scalar(i) or vec(i) (for kPack<T> elements from i) over [begin, end), spreading the
// work over the block's threads; vectors only where every base pointer is 16-byte aligned.
template <typename T, typename Scalar, typename Vec>
__device__ void ForEachInRange(size_t begin, size_t end, bool vec_ok, Scalar scalar, Vec vec) {
  constexpr size_t n = kPack<T>;
  const VectorSplit s = SplitForVectors(begin, end, n, vec_ok);  // kernels/cuda_plan.h
  for (size_t i = begin + threadIdx.x; i < s.head; i += blockDim.x) scalar(i);
  for (size_t i = s.head + threadIdx.x * n; i < s.body_end; i += blockDim.x * n) vec(i);
  for (size_t i = s.body_end + threadIdx.x; i < end; i += blockDim.x) scalar(i);
}

// Copies [begin, end) of `in` to `stage` (no copy when they are the same) counting non-finite
// values in the same pass; the block's count goes to *counter with one atomic.
template <typename T>
__device__ void CopyInRange(const T* in, T* stage, size_t begin, size_t end, bool vec_ok,
                            bool check, unsigned long long* counter) {
  __shared__ unsigned long long block_bad;
  if (threadIdx.x == 0) block_bad = 0;
  __syncthreads();
  unsigned bad = 0;
  const bool copy = in != stage;
  ForEachInRange<T>(
      begin, end, vec_ok,
      [&](size_t i) {
        const T x = in[i];
        if (copy) stage[i] = x;
        bad += IsNonFinite(x) ? 1u : 0u;
      },
      [&](size_t i) {
        const PackOf<T> p = *reinterpret_cast<const PackOf<T>*>(in + i);
        if (copy) *reinterpret_cast<PackOf<T>*>(stage + i) = p;
        for (size_t k = 0; k < kPack<T>; ++k) bad += IsNonFinite(p.v[k]) ? 1u : 0u;
      });
  if (check && bad != 0) atomicAdd(&block_bad, static_cast<unsigned long long>(bad));
  __syncthreads();
  if (check && threadIdx.x == 0 && block_bad != 0 && counter != nullptr) {
    atomicAdd(counter, block_bad);
  }
}

template <typename T>
__device__ void CopyRange(const T* src, T* dst, size_t begin, size_t end, bool vec_ok) {
  if (src == dst) return;
  ForEachInRange<T>(
      begin, end, vec_ok, [&](size_t i) { dst[i] = src[i]; },
      [&](size_t i) {
        *reinterpret_cast<PackOf<T>*>(dst + i) = *reinterpret_cast<const PackOf<T>*>(src + i);
      });
}

// dst[i] = reduction of srcs[0..w)[i] in rank order, the element functions of element_ops.h.
template <typename T, ReduceOp Op>
__device__ void ReduceRange(const T* const* srcs, int w, size_t begin, size_t end, T* dst,
                            bool vec_ok) {
  ForEachInRange<T>(
      begin, end, vec_ok, [&](size_t i) { dst[i] = ReduceElement<T, Op>(srcs, w, i, w); },
      [&](size_t i) {
        AccType<T> acc[kPack<T>];
        const PackOf<T> first = *reinterpret_cast<const PackOf<T>*>(srcs[0] + i);
        for (size_t k = 0; k < kPack<T>; ++k) acc[k] = ToAcc(first.v[k]);
        for (int p = 1; p < w; ++p) {
          const PackOf<T> x = *reinterpret_cast<const PackOf<T>*>(srcs[p] + i);
          for (size_t k = 0; k < kPack<T>; ++k) acc[k] = Combine<Op>(acc[k], ToAcc(x.v[k]));
        }
        PackOf<T> out;
        for (size_t k = 0; k < kPack<T>; ++k) out.v[k] = FromAcc<T>(Finalize<Op>(acc[k], w));
        *reinterpret_cast<PackOf<T>*>(dst + i) = out;
      });
}

template <typename T>
__device__ T* Staged(const CudaCommView& v, int rank, size_t offset) {
  return reinterpret_cast<T*>(v.data[rank] + offset);
}

// Block blockIdx.x's part of chunk `part` of `count` elements split over `parts`.
__device__ ChunkRange BlockPart(size_t count, int parts, int part) {
  return kernels::BlockPart(count, parts, part, static_cast<int>(gridDim.x),
                            static_cast<int>(blockIdx.x));
}

// Copy-in of `total` staged elements as world_size chunks, block b taking part b of each: the
// part of a chunk that block b of a peer reads is the part our block b staged.
template <typename T>
__device__ void CopyInChunks(const CudaCommView& v, const LaunchArgs& a, size_t total,
                             bool vec_ok) {
  for (int p = 0; p < v.world_size; ++p) {
    const ChunkRange r = BlockPart(total, v.world_size, p);
    CopyInRange<T>(static_cast<const T*>(a.input), Staged<T>(v, v.rank, a.offset), r.begin, r.end,
                   vec_ok, a.nan_check == NanCheck::kOn, v.nonfinite_count);
  }
}

__global__ void __launch_bounds__(kCudaThreads) BarrierKernel(CudaCommView v) { BlockBarrier(v); }

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kCudaThreads)
    OneShotKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const ChunkRange r = BlockPart(a.count, 1, 0);
  T* own = Staged<T>(v, v.rank, a.offset);
  CopyInRange<T>(static_cast<const T*>(a.input), own, r.begin, r.end, vec_ok,
                 a.nan_check == NanCheck::kOn, v.nonfinite_count);
  if (!BlockBarrier(v)) return;
  const T* srcs[kCudaMaxWorldSize];
  for (int p = 0; p < v.world_size; ++p) srcs[p] = Staged<T>(v, p, a.offset);
  // Peers read our staged input until the second barrier: an output that is that input gets
  // the sum through scratch, after it; any other output (outside every data region) directly.
  T* dst = static_cast<T*>(a.output_is_input ? a.scratch : a.output);
  ReduceRange<T, Op>(srcs, v.world_size, r.begin, r.end, dst, vec_ok);
  if (!BlockBarrier(v)) return;  // no peer reads our staged input any more
  if (a.output_is_input) CopyRange<T>(dst, own, r.begin, r.end, vec_ok);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kCudaThreads)
    TwoShotKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const int w = v.world_size;
  T* own = Staged<T>(v, v.rank, a.offset);
  CopyInChunks<T>(v, a, a.count, vec_ok);
  if (!BlockBarrier(v)) return;
  const T* srcs[kCudaMaxWorldSize];
  for (int p = 0; p < w; ++p) srcs[p] = Staged<T>(v, p, a.offset);
  const ChunkRange mine = BlockPart(a.count, w, v.rank);
  ReduceRange<T, Op>(srcs, w, mine.begin, mine.end, own, vec_ok);  // only we read our chunk
  if (!BlockBarrier(v)) return;
  for (int p = 0; p < w; ++p) {
    const ChunkRange r = BlockPart(a.count, w, p);
    CopyRange<T>(srcs[p], static_cast<T*>(a.output), r.begin, r.end, vec_ok);
  }
  BlockBarrier(v);
}

template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    AllGatherKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const ChunkRange r = BlockPart(a.count, 1, 0);
  CopyInRange<T>(static_cast<const T*>(a.input), Staged<T>(v, v.rank, a.offset), r.begin, r.end,
                 vec_ok, a.nan_check == NanCheck::kOn, v.nonfinite_count);
  if (!BlockBarrier(v)) return;
  for (int p = 0; p < v.world_size; ++p) {
    T* out = static_cast<T*>(a.output) + static_cast<size_t>(p) * a.count;
    CopyRange<T>(Staged<T>(v, p, a.offset), out, r.begin, r.end, vec_ok);
  }
  BlockBarrier(v);
}

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kCudaThreads)
    ReduceScatterKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const int w = v.world_size;
  CopyInChunks<T>(v, a, a.count * static_cast<size_t>(w), vec_ok);
  if (!BlockBarrier(v)) return;
  const T* srcs[kCudaMaxWorldSize];
  const size_t first = static_cast<size_t>(v.rank) * a.count;
  for (int p = 0; p < w; ++p) srcs[p] = Staged<T>(v, p, a.offset) + first;
  const ChunkRange r = BlockPart(a.count, 1, 0);
  ReduceRange<T, Op>(srcs, w, r.begin, r.end, static_cast<T*>(a.output), vec_ok);
  BlockBarrier(v);
}

// Only the root's buffer is staged; every other rank copies it from the root's region.
template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    BroadcastKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const ChunkRange r = BlockPart(a.count, 1, 0);
  if (v.rank == a.root) {
    CopyInRange<T>(static_cast<const T*>(a.input), Staged<T>(v, v.rank, a.offset), r.begin, r.end,
                   vec_ok, a.nan_check == NanCheck::kOn, v.nonfinite_count);
  }
  if (!BlockBarrier(v)) return;
  if (v.rank != a.root) {
    CopyRange<T>(Staged<T>(v, a.root, a.offset), static_cast<T*>(a.output), r.begin, r.end, vec_ok);
  }
  BlockBarrier(v);  // the root's region stays until every peer has read it
}

// Block p of the output is chunk `rank` of rank p's staged input.
template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    AllToAllKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const int w = v.world_size;
  CopyInChunks<T>(v, a, a.count * static_cast<size_t>(w), vec_ok);
  if (!BlockBarrier(v)) return;
  const size_t first = static_cast<size_t>(v.rank) * a.count;
  const ChunkRange r = BlockPart(a.count, 1, 0);
  for (int p = 0; p < w; ++p) {
    T* out = static_cast<T*>(a.output) + static_cast<size_t>(p) * a.count;
    CopyRange<T>(Staged<T>(v, p, a.offset) + first, out, r.begin, r.end, vec_ok);
  }
  BlockBarrier(v);
}

// Counts the non-finite values of this rank's `count` elements at a.input, reading them once
// and writing nothing but the counter (no peer takes part: no barrier).
template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    CountNonFiniteKernel(CudaCommView v, LaunchArgs a, bool vec_ok) {
  const ChunkRange r = BlockPart(a.count, 1, 0);
  const T* in = static_cast<const T*>(a.input);
  CopyInRange<T>(in, const_cast<T*>(in), r.begin, r.end, vec_ok, true, v.nonfinite_count);
}

// Whether 16-byte vector accesses are aligned everywhere the kernel makes them
// (kernels/cuda_plan.h): ForEachInRange aligns element indices relative to each base
// pointer, and all-gather, reduce-scatter and all-to-all index chunks at base + p * count.
template <typename T>
bool VectorsAligned(const CudaCommView& v, const LaunchArgs& a) {
  const void* bases[kCudaMaxWorldSize + 3] = {a.input, a.output};
  int n = 2;
  if (a.scratch != nullptr) bases[n++] = a.scratch;
  for (int p = 0; p < v.world_size; ++p) bases[n++] = v.data[p];
  const bool chunked = a.collective == CollectiveOp::kAllGather ||
                       a.collective == CollectiveOp::kReduceScatter ||
                       a.collective == CollectiveOp::kAllToAll;
  return kernels::VectorsAligned(bases, n, a.offset, chunked ? a.count * sizeof(T) : 0);
}

template <typename T, ReduceOp Op>
void LaunchTyped(const CudaCommView& v, const LaunchArgs& a, cudaStream_t s) {
  const bool vec_ok = VectorsAligned<T>(v, a);
  const dim3 grid(kCudaBlocks), block(kCudaThreads);
  if (a.count_only) return CountNonFiniteKernel<T><<<grid, block, 0, s>>>(v, a, vec_ok);
  switch (a.collective) {
    case CollectiveOp::kAllReduce:
      if (a.algorithm == Algorithm::kOneShot) {
        return OneShotKernel<T, Op><<<grid, block, 0, s>>>(v, a, vec_ok);
      }
      return TwoShotKernel<T, Op><<<grid, block, 0, s>>>(v, a, vec_ok);
    case CollectiveOp::kAllGather:
      return AllGatherKernel<T><<<grid, block, 0, s>>>(v, a, vec_ok);
    case CollectiveOp::kReduceScatter:
      return ReduceScatterKernel<T, Op><<<grid, block, 0, s>>>(v, a, vec_ok);
    case CollectiveOp::kBroadcast:
      return BroadcastKernel<T><<<grid, block, 0, s>>>(v, a, vec_ok);
    case CollectiveOp::kAllToAll:
      return AllToAllKernel<T><<<grid, block, 0, s>>>(v, a, vec_ok);
    default:  // kBarrier is launched untyped; launch.cc passes no other
      return;
  }
}

// False, launching nothing, for an op not defined on T (a bitwise op of a float, which
// ReduceOpApplies refused before). The collectives that do not reduce ignore the op: they
// launch as kSum's instantiation.
template <typename T>
struct TypedLaunch {
  const CudaCommView& v;
  const LaunchArgs& a;
  cudaStream_t s;
  template <ReduceOp Op>
  void operator()() const {
    LaunchTyped<T, Op>(v, a, s);
  }
};

template <typename T>
bool LaunchWithOp(const CudaCommView& v, const LaunchArgs& a, cudaStream_t s) {
  const ReduceOp op = CollectiveInfo(a.collective).reduces() ? a.op : ReduceOp::kSum;
  return DispatchReduceOp<T>(op, TypedLaunch<T>{v, a, s});
}

// Calls f.template operator()<Op>() for every op defined on T.
template <typename T, typename F>
void ForEachReduceOp(F&& f) {
  for (int o = 0; o < kReduceOpCount; ++o) DispatchReduceOp<T>(static_cast<ReduceOp>(o), f);
}

// Every kernel this file can launch, for PreloadKernels: cudaFuncGetAttributes loads a
// function into the current context (the CUDA Programming Guide's lazy loading section names
// it for preloading; NCCL calls it on its whole kernel list when a communicator is created
// for the same reason).
template <typename T, ReduceOp Op>
cudaError_t PreloadTypedOp() {
  cudaFuncAttributes attr;
  for (const void* f : {reinterpret_cast<const void*>(&OneShotKernel<T, Op>),
                        reinterpret_cast<const void*>(&TwoShotKernel<T, Op>),
                        reinterpret_cast<const void*>(&ReduceScatterKernel<T, Op>)}) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attr, f); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T>
struct PreloadOps {
  cudaError_t err = cudaSuccess;
  template <ReduceOp Op>
  void operator()() {
    if (err == cudaSuccess) err = PreloadTypedOp<T, Op>();
  }
};

template <typename T>
cudaError_t PreloadTyped() {
  cudaFuncAttributes attr;
  for (const void* f : {reinterpret_cast<const void*>(&AllGatherKernel<T>),
                        reinterpret_cast<const void*>(&BroadcastKernel<T>),
                        reinterpret_cast<const void*>(&AllToAllKernel<T>),
                        reinterpret_cast<const void*>(&CountNonFiniteKernel<T>)}) {
    if (const cudaError_t err = cudaFuncGetAttributes(&attr, f); err != cudaSuccess) return err;
  }
  PreloadOps<T> preload;
  ForEachReduceOp<T>(preload);
  return preload.err;
}

// The fewest resident blocks per SM over `kernels`, folded into *least.
cudaError_t FoldOccupancy(std::initializer_list<const void*> kernels, int* least) {
  for (const void* f : kernels) {
    int blocks = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, kCudaThreads, 0);
    if (err != cudaSuccess) return err;
    if (blocks < *least) *least = blocks;
  }
  return cudaSuccess;
}

template <typename T, ReduceOp Op>
cudaError_t OccupancyTypedOp(int* least) {
  return FoldOccupancy({reinterpret_cast<const void*>(&OneShotKernel<T, Op>),
                        reinterpret_cast<const void*>(&TwoShotKernel<T, Op>),
                        reinterpret_cast<const void*>(&ReduceScatterKernel<T, Op>)},
                       least);
}

template <typename T>
struct OccupancyOps {
  cudaError_t err;
  int* least;
  template <ReduceOp Op>
  void operator()() {
    if (err == cudaSuccess) err = OccupancyTypedOp<T, Op>(least);
  }
};

template <typename T>
cudaError_t OccupancyTyped(int* least) {
  cudaError_t err = FoldOccupancy({reinterpret_cast<const void*>(&AllGatherKernel<T>),
                                   reinterpret_cast<const void*>(&BroadcastKernel<T>),
                                   reinterpret_cast<const void*>(&AllToAllKernel<T>),
                                   reinterpret_cast<const void*>(&CountNonFiniteKernel<T>)},
                                  least);
  OccupancyOps<T> occupancy{err, least};
  ForEachReduceOp<T>(occupancy);
  return occupancy.err;
}

}  // namespace

cudaError_t LaunchKernel(const CudaCommView& view, const LaunchArgs& args, cudaStream_t stream) {
  if (args.collective == CollectiveOp::kBarrier) {
    BarrierKernel<<<kCudaBlocks, kCudaThreads, 0, stream>>>(view);
    return cudaGetLastError();
  }
  switch (args.dtype) {
    case DataType::kFloat32:
      if (!LaunchWithOp<float>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kFloat16:
      if (!LaunchWithOp<Half>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kBFloat16:
      if (!LaunchWithOp<BFloat16>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kFloat64:
      if (!LaunchWithOp<double>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kInt32:
      if (!LaunchWithOp<int32_t>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kInt64:
      if (!LaunchWithOp<int64_t>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kInt8:
      if (!LaunchWithOp<int8_t>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kUInt8:
      if (!LaunchWithOp<uint8_t>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kBool:
      if (!LaunchWithOp<Bool8>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    case DataType::kInt16:
      if (!LaunchWithOp<int16_t>(view, args, stream)) return cudaErrorInvalidValue;
      break;
    default:
      return cudaErrorInvalidValue;  // not a collective type: launch.cc refuses it first
  }
  return cudaGetLastError();
}

cudaError_t PreloadKernels() {
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&BarrierKernel));
  for (cudaError_t e : {PreloadTyped<float>(), PreloadTyped<Half>(), PreloadTyped<BFloat16>(),
                        PreloadTyped<double>(), PreloadTyped<int32_t>(), PreloadTyped<int64_t>(),
                        PreloadTyped<int8_t>(), PreloadTyped<uint8_t>(), PreloadTyped<Bool8>(),
                        PreloadTyped<int16_t>()}) {
    if (err == cudaSuccess) err = e;
  }
  return err;
}

cudaError_t MinResidentBlocksPerSm(int* blocks_per_sm) {
  int least = 1 << 30;
  cudaError_t err = FoldOccupancy({reinterpret_cast<const void*>(&BarrierKernel)}, &least);
  for (cudaError_t e : {OccupancyTyped<float>(&least), OccupancyTyped<Half>(&least),
                        OccupancyTyped<BFloat16>(&least), OccupancyTyped<double>(&least),
                        OccupancyTyped<int32_t>(&least), OccupancyTyped<int64_t>(&least),
                        OccupancyTyped<int8_t>(&least), OccupancyTyped<uint8_t>(&least),
                        OccupancyTyped<Bool8>(&least), OccupancyTyped<int16_t>(&least)}) {
    if (err == cudaSuccess) err = e;
  }
  *blocks_per_sm = err == cudaSuccess ? least : 0;
  return err;
}

}  // namespace commd::kernels::cuda_internal
