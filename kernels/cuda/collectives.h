// The collectives as CUDA kernels over peer-mapped device memory (the GPU twin of
// kernels/host/collectives.h): barrier, one-shot and two-shot all-reduce, all-gather,
// reduce-scatter, broadcast and all-to-all (equal splits), with the NaN/Inf count fused into
// copy-in, and a count-only pass for inputs no collective kernel reads (LaunchCountNonFinite).
// Per-element work is done by the host-device functions of kernels/element_ops.h that the CPU path
// shares and tests.
//
//   CudaCommView view = ...;                 // peer pointers from the SDK's CUDA mapping
//   RETURN_IF_ERROR(LaunchAllReduce(view, view.data[view.rank], view.data[view.rank], n,
//                                   DataType::kBFloat16, ReduceOp::kSum, Algorithm::kTwoShot,
//                                   NanCheck::kOn, scratch, stream));
//
// Launches are asynchronous on `stream`; the returned status covers argument checks and the
// launch itself. A wait that fails on the device (abort word set, or a peer not arriving
// within timeout_ns) writes (code << 16 | peer) to *error_word (code 1: aborted, 2: timed
// out) and ends the kernel early; the caller reads the word after the stream completes.
// Placement rules are the CPU path's (collectives.h), with one addition: a one-shot all-reduce
// whose output is its input in this rank's data region needs `scratch`, count elements of
// device memory outside every data region (peers read that input until the last barrier, so
// the sum cannot be written over it before); with a separate output it needs none.
//
// Signal pads: each of the kCudaBlocks thread blocks synchronises on its own channel
// (kernels/signal_layout.h), so pad_slots must be >= kCudaBlocks * world_size. Every launch
// uses exactly kCudaBlocks blocks and splits the elements the same way, so block b of every
// rank touches the same elements and per-block barriers order all reuse.
// Thread-compatible: one stream per allocation at a time (the SDK gives each stream its own
// one-shot scratch, so different allocations may run on different streams at once).
#ifndef COMMD_KERNELS_CUDA_COLLECTIVES_H_
#define COMMD_KERNELS_CUDA_COLLECTIVES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "commd/vocabulary.h"
#include "kernels/algorithm.h"
#include "kernels/types.h"

namespace commd::kernels {

inline constexpr int kCudaMaxWorldSize = 16;
inline constexpr int kCudaBlocks = 16;  // == kSignalPadChannels
inline constexpr int kCudaThreads = 512;

// Passed by value to every kernel.
struct CudaCommView {
  int rank = -1;
  int world_size = 0;
  std::byte* data[kCudaMaxWorldSize] = {};  // each rank's data region, mapped here
  uint32_t* pads[kCudaMaxWorldSize] = {};   // each rank's signal pad, mapped here
  size_t data_bytes = 0;
  size_t pad_slots = 0;
  const uint32_t* abort_word = nullptr;           // device-accessible; may be null
  uint32_t* error_word = nullptr;                 // device-accessible; may be null
  unsigned long long* nonfinite_count = nullptr;  // device-accessible; added to; may be null
  uint64_t timeout_ns = 600ull * 1000000000ull;   // per wait, measured by %globaltimer
};

absl::Status ValidateCudaCommView(const CudaCommView& view);

absl::Status LaunchBarrier(const CudaCommView& view, cudaStream_t stream);
absl::Status LaunchAllReduce(const CudaCommView& view, const void* input, void* output,
                             size_t count, DataType dtype, ReduceOp op, Algorithm algorithm,
                             NanCheck nan_check, void* scratch, cudaStream_t stream);
absl::Status LaunchAllGather(const CudaCommView& view, const void* input, void* output,
                             size_t count, DataType dtype, NanCheck nan_check, cudaStream_t stream);
absl::Status LaunchReduceScatter(const CudaCommView& view, const void* input, void* output,
                                 size_t count, DataType dtype, ReduceOp op, NanCheck nan_check,
                                 cudaStream_t stream);
// The CPU path's Broadcast and AllToAll (host/collectives.h): same placement, same results.
absl::Status LaunchBroadcast(const CudaCommView& view, void* buffer, size_t count, DataType dtype,
                             int root, NanCheck nan_check, cudaStream_t stream);
absl::Status LaunchAllToAll(const CudaCommView& view, const void* input, void* output, size_t count,
                            DataType dtype, NanCheck nan_check, cudaStream_t stream);
// Adds the number of NaN/Inf among `count` elements at `input` (device memory this rank
// reads) to *view.nonfinite_count; reads nothing else, writes nothing else and meets no peer,
// so it runs on a node of one rank too (the spanning path's check where no node-local kernel
// reads the input: client/src/cuda_span_collectives.cc). Nothing is launched without a
// counter or elements.
absl::Status LaunchCountNonFinite(const CudaCommView& view, const void* input, size_t count,
                                  DataType dtype, cudaStream_t stream);

// Loads every kernel instantiation of this library into the current context (the caller's
// device must be current), once per process: with lazy module loading (CUDA 12.2's default)
// a kernel's first launch loads its module, which can wait for the device while a commd
// kernel spins on a peer that needs this rank's next kernel: a deadlock. INTERNAL naming the
// CUDA error otherwise; later calls return the first answer.
absl::Status PreloadCudaKernels();

// Blocks of the collective kernels the current device holds resident at once: its SM count x
// the fewest resident blocks per SM of any instantiation. The `resident_blocks` that
// GridForSharedDevice (kernels/cuda_plan.h) takes when ranks share the device (docs/
// gpu-testing.md "Several ranks on one GPU"). INTERNAL naming the CUDA error.
absl::StatusOr<int> ResidentCollectiveBlocks();

namespace cuda_internal {

// A validated launch: `offset` is the staged input's byte offset in every data region;
// `in_place` means the input already is this rank's staged copy; `output_is_input` that the
// output is that very copy (an in-place all-reduce or broadcast in the data region: the
// one-shot kernel then reduces into scratch and copies back after its last barrier; any
// other output is written directly). `collective` is the SDK's
// one enum (kBarrier, kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll here),
// `algorithm` picks one-shot or two-shot for kAllReduce.
struct LaunchArgs {
  CollectiveOp collective;
  Algorithm algorithm;
  const void* input;
  void* output;
  void* scratch;
  size_t count;
  size_t offset;
  bool in_place;
  bool output_is_input;
  DataType dtype;
  ReduceOp op;
  NanCheck nan_check;
  int root = 0;  // broadcast
  // LaunchCountNonFinite: only count the NaN/Inf of `count` elements at `input` (collective
  // says nothing then).
  bool count_only = false;
};

// The boundary with the CUDA runtime (collectives.cu): the kernel launch itself, and loading
// every kernel instantiation a group may launch. Tests of the host side (the SDK's handling
// of a launch failing part way through a coalesced call) replace it with
// SetKernelRuntimeForTesting; nothing else does.
struct KernelRuntime {
  cudaError_t (*launch)(const CudaCommView& view, const LaunchArgs& args, cudaStream_t stream);
  cudaError_t (*preload)();
};
const KernelRuntime& CurrentKernelRuntime();
// Null restores the real one. Not thread-safe against launches: set it before any.
void SetKernelRuntimeForTesting(const KernelRuntime* runtime);

// Defined in collectives.cu.
cudaError_t LaunchKernel(const CudaCommView& view, const LaunchArgs& args, cudaStream_t stream);
// cudaFuncGetAttributes on every instantiation (collectives.cu says why).
cudaError_t PreloadKernels();
// The fewest blocks per SM of kCudaThreads that any kernel instantiation keeps resident on
// the current device (cudaOccupancyMaxActiveBlocksPerMultiprocessor, no dynamic shared
// memory), into *blocks_per_sm.
cudaError_t MinResidentBlocksPerSm(int* blocks_per_sm);

}  // namespace cuda_internal
}  // namespace commd::kernels

#endif  // COMMD_KERNELS_CUDA_COLLECTIVES_H_
