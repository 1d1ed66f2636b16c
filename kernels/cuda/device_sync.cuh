// Device-side signal pad operations (protocol: kernels/signal_layout.h): system-scope release
// stores and acquire loads, and the per-block barrier with deadline and abort checks.
#ifndef COMMD_KERNELS_CUDA_DEVICE_SYNC_CUH_
#define COMMD_KERNELS_CUDA_DEVICE_SYNC_CUH_

#include <cstdint>

#include "kernels/cuda/collectives.h"
#include "kernels/signal_layout.h"

namespace commd::kernels::cuda_device {

__device__ __forceinline__ void StoreRelease(uint32_t* addr, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t LoadVolatile(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

enum : uint32_t { kErrorAborted = 1, kErrorTimedOut = 2 };

// How often a waiting thread reads the abort word. It lies in pinned host memory, so each read
// is a round trip over PCIe (~1-2 us); polling it on every spin would cost that per barrier
// wait. An abort is a failure path measured in seconds, so 50 us of lag is nothing; the peer's
// slot (device memory, NVLink) is still read on every spin.
inline constexpr uint64_t kAbortPollNs = 50 * 1000;

// Spins (this thread alone) until `slot`, which only `peer` writes, reaches `seq` (values
// only grow, compared by signed difference: kernels/signal_layout.h). False when the abort
// word is set or the wait outlasts v.timeout_ns; the first failure is in the error word.
__device__ inline bool WaitForSlot(const CudaCommView& v, const uint32_t* slot, uint32_t seq,
                                   int peer) {
  const uint64_t start = GlobalTimerNs();
  uint64_t next_abort_poll = start;  // the abort word is read on the first spin
  while (static_cast<int32_t>(LoadAcquire(slot) - seq) < 0) {
    const uint64_t now = GlobalTimerNs();
    uint32_t code = 0;
    if (v.abort_word != nullptr && now >= next_abort_poll) {
      next_abort_poll = now + kAbortPollNs;
      if (LoadVolatile(v.abort_word) != 0) code = kErrorAborted;
    }
    if (now - start > v.timeout_ns) code = kErrorTimedOut;
    if (code != 0) {
      // A peer that arrived just before the abort (or the timeout) has done its part, as on
      // the host (kernels/host/barrier.cc): look once more before failing.
      if (static_cast<int32_t>(LoadAcquire(slot) - seq) >= 0) return true;
      if (v.error_word != nullptr) atomicCAS(v.error_word, 0u, code << 16 | peer);
      return false;
    }
    __nanosleep(256);
  }
  return true;
}

// Barrier of block blockIdx.x with block blockIdx.x of every peer, on channel blockIdx.x.
// Returns false (for every thread of the block) when a wait failed; the error word is set.
//
// Ordering (PTX ISA, memory consistency model): the block's data writes happen before the
// bar.sync of __syncthreads (a CTA-scope synchronisation), which happens before the arriving
// thread's st.release.sys; release is cumulative, so a peer whose ld.acquire.sys reads that
// value observes every write ordered before the release in causality order, those of the
// other threads of the block included. No fence.sc.sys (__threadfence_system) is needed
// before the release store: PyTorch's symmetric-memory barrier and vLLM's custom all-reduce
// rely on the same bar.sync + release pattern.
__device__ inline bool BlockBarrier(const CudaCommView& v) {
  __shared__ uint32_t seq;
  __shared__ int failed;
  const int ch = blockIdx.x;
  const int w = v.world_size;
  __syncthreads();  // the block's writes before arriving
  if (threadIdx.x == 0) {
    uint32_t* own = v.pads[v.rank] + PadSlot(ch, v.rank, w);
    seq = *own + 1;
    *own = seq;
    failed = 0;
  }
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < w && peer != v.rank) {
    StoreRelease(v.pads[peer] + PadSlot(ch, v.rank, w), seq);
    if (!WaitForSlot(v, v.pads[v.rank] + PadSlot(ch, peer, w), seq, peer)) failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

}  // namespace commd::kernels::cuda_device

#endif  // COMMD_KERNELS_CUDA_DEVICE_SYNC_CUH_
