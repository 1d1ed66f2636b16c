// The host-decidable logic of the CUDA collectives, written once and unit-tested on every
// build (kernels/cuda_plan_test.cc): how a launch splits elements over ranks and thread blocks,
// where 16-byte vector accesses may be used, which scratch a one-shot in-place all-reduce
// takes (one per stream), and which NaN/Inf counter slot a call may write. The kernels
// (kernels/cuda/collectives.cu) and the SDK's CUDA backend (client/src/cuda_collectives.cc)
// call these; nothing here needs a CUDA header or a device.
//
//   const ChunkRange r = BlockPart(count, world_size, rank, kCudaBlocks, blockIdx.x);
//   const VectorSplit s = SplitForVectors(r.begin, r.end, 16 / sizeof(T), vec_ok);
#ifndef COMMD_KERNELS_CUDA_PLAN_H_
#define COMMD_KERNELS_CUDA_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/algorithm.h"
#include "kernels/host_device.h"

namespace commd::kernels {

inline constexpr size_t kVectorBytes = 16;  // one vector access (uint4, PackOf<T>)

// Block `block` of `blocks`'s part of chunk `part` of `count` elements split over `parts`:
// the chunk (Chunk, shared with the CPU path) split again over the blocks. Every rank computes
// the same split, so block b of a peer reads exactly what our block b staged.
COMMD_HOST_DEVICE constexpr ChunkRange BlockPart(size_t count, int parts, int part, int blocks,
                                                 int block) {
  const ChunkRange c = Chunk(count, parts, part);
  const ChunkRange b = Chunk(c.end - c.begin, blocks, block);
  return ChunkRange{c.begin + b.begin, c.begin + b.end};
}

// How ForEachInRange walks [begin, end) with `pack` elements per vector: scalars on
// [begin, head), vectors on [head, body_end) (a multiple of pack from a multiple of pack,
// so aligned when the base is), scalars on [body_end, end). Without vectors all is head.
struct VectorSplit {
  size_t head;
  size_t body_end;
};
COMMD_HOST_DEVICE constexpr VectorSplit SplitForVectors(size_t begin, size_t end, size_t pack,
                                                        bool vec_ok) {
  if (!vec_ok || begin >= end) return VectorSplit{end, end};
  const size_t up = (begin + pack - 1) / pack * pack;
  const size_t head = up < end ? up : end;
  return VectorSplit{head, head + (end - head) / pack * pack};
}

// Whether a launch may use 16-byte accesses: every base pointer it indexes from (the input,
// the output, the scratch, each rank's data region; null ones are not used) is 16-byte
// aligned, the staging offset is, and, for collectives that address rank p's chunk at
// base + p * count (all-gather's output, reduce-scatter's and all-to-all's staged input),
// so is the chunk stride count * element_size (`chunk_stride_bytes`, 0 when not chunked).
bool VectorsAligned(const void* const* bases, int n, size_t offset, size_t chunk_stride_bytes);

// Scratch of the one-shot in-place all-reduce, one per stream: calls on one stream run in
// order and may share it; calls on two streams may run at once and must not. At most
// kMaxStreams streams keep one; another stream takes the least recently used one's after
// the caller has waited for that stream's calls. Sizes are rounded up to kGranule.
class ScratchTable {
 public:
  static constexpr int kMaxStreams = 8;
  static constexpr size_t kGranule = size_t{1} << 20;

  enum class Action {
    kReuse,     // slot's scratch is large enough: use it
    kAllocate,  // slot is empty: allocate `bytes`
    kGrow,      // slot belongs to this stream but is too small: wait for `stream`'s calls,
                // free it, allocate `bytes`
    kEvict,     // every slot is taken: wait for `evicted`'s calls, free it, allocate `bytes`
  };
  struct Choice {
    Action action;
    int slot;
    size_t bytes;       // to allocate (rounded), or the slot's size for kReuse
    uintptr_t evicted;  // kEvict: the stream whose scratch is taken
  };

  // What a call on `stream` needing `bytes` (> 0) does; Commit once it is done.
  Choice Choose(uintptr_t stream, size_t bytes) const;
  // Records that `slot` now holds `bytes` for `stream`, used now.
  void Commit(int slot, uintptr_t stream, size_t bytes);
  // Empties `slot` (its scratch was freed and none replaced it).
  void Clear(int slot) { slots_[slot] = Slot{}; }
  // The slot `stream` holds, or -1.
  int Find(uintptr_t stream) const;
  size_t bytes(int slot) const { return slots_[slot].bytes; }

 private:
  struct Slot {
    bool used = false;
    uintptr_t stream = 0;
    size_t bytes = 0;
    uint64_t last_use = 0;
  };
  Slot slots_[kMaxStreams];
  uint64_t tick_ = 0;
};

// The per-call NaN/Inf counters: a slot is in use from the call that takes it until that
// call is retired, however the call ended. A call whose launch failed after some of its
// kernels were enqueued keeps its slot until those kernels are known finished (they may still
// add to it), never handing it to a later call.
class CounterSlots {
 public:
  explicit CounterSlots(int slots) : in_use_(static_cast<size_t>(slots), false) {}
  // A free slot (the next after the last taken, round robin), marked in use; -1 when all are
  // in use (the caller retires the oldest call and tries again).
  int Take();
  void Release(int slot) { in_use_[static_cast<size_t>(slot)] = false; }
  bool in_use(int slot) const { return in_use_[static_cast<size_t>(slot)]; }

 private:
  std::vector<bool> in_use_;
  size_t next_ = 0;
};

// Several ranks on one GPU (issue #36): every kernel of a collective spins at barriers on
// its peers' kernels of the same collective, block b on block b. When ranks share a device
// and their kernels run at once (MPS, or several streams of one process), a block spinning on
// SMs that a peer's not-yet-resident block needs would wait forever; so every rank's grid
// must be resident together. Given what the occupancy API says for the launch
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor x SM count = `resident_blocks` of the
// device) and how many commd kernels may be in flight on it at once (`ranks_on_device` x
// `kernels_per_rank`, e.g. 2 for two streams), the largest grid, at most `max_blocks`, that
// lets all of them be resident together; 0 when not even one block per kernel fits. Without
// MPS the kernels of different processes are time-sliced, never co-resident: the driver's
// compute preemption swaps the spinning context out, so waits still end (a barrier then
// costs up to a time slice per rank on the device), and this bound is what MPS needs.
// The grid must be the same on every rank of a group (block b pairs with block b), so the
// caller passes the group's largest `ranks_on_device` and its smallest `resident_blocks`.
struct ResidentGrid {
  int blocks;   // per kernel: min(max_blocks, resident_blocks / kernels), 0 if none fit
  int kernels;  // ranks_on_device x kernels_per_rank
  bool capped;  // blocks < max_blocks: residency, not max_blocks, set the grid
};
ResidentGrid GridForSharedDevice(int resident_blocks, int ranks_on_device, int kernels_per_rank,
                                 int max_blocks);

// The largest number of ranks one device takes with every kernel resident at `blocks` each
// (for messages and `commctl`): resident_blocks / (blocks x kernels_per_rank).
int MaxRanksOnDevice(int resident_blocks, int blocks, int kernels_per_rank);

// Whether a collective that failed with `failure` after `enqueued` of its kernels were on the
// stream leaves this rank's barrier counts apart from its peers' (the group must then fail
// for good): yes once any kernel was enqueued (a coalesced call failing at tensor k > 0), and
// when the launch itself failed (peers' kernels wait for one that never comes); no for an
// argument check (INVALID_ARGUMENT, UNIMPLEMENTED) refusing the call before its first kernel.
bool LaunchFailureDesyncs(int enqueued, const absl::Status& failure);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_CUDA_PLAN_H_
