#include "kernels/cuda_plan.h"

namespace commd::kernels {

bool VectorsAligned(const void* const* bases, int n, size_t offset, size_t chunk_stride_bytes) {
  for (int i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(bases[i]) % kVectorBytes != 0) return false;
  }
  return offset % kVectorBytes == 0 && chunk_stride_bytes % kVectorBytes == 0;
}

ScratchTable::Choice ScratchTable::Choose(uintptr_t stream, size_t bytes) const {
  const size_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
  if (const int own = Find(stream); own >= 0) {
    if (slots_[own].bytes >= bytes) return {Action::kReuse, own, slots_[own].bytes, 0};
    return {Action::kGrow, own, rounded, 0};
  }
  int oldest = 0;
  for (int i = 0; i < kMaxStreams; ++i) {
    if (!slots_[i].used) return {Action::kAllocate, i, rounded, 0};
    if (slots_[i].last_use < slots_[oldest].last_use) oldest = i;
  }
  return {Action::kEvict, oldest, rounded, slots_[oldest].stream};
}

void ScratchTable::Commit(int slot, uintptr_t stream, size_t bytes) {
  slots_[slot] = Slot{true, stream, bytes, ++tick_};
}

int ScratchTable::Find(uintptr_t stream) const {
  for (int i = 0; i < kMaxStreams; ++i) {
    if (slots_[i].used && slots_[i].stream == stream) return i;
  }
  return -1;
}

int CounterSlots::Take() {
  const size_t n = in_use_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t slot = (next_ + k) % n;
    if (in_use_[slot]) continue;
    in_use_[slot] = true;
    next_ = (slot + 1) % n;
    return static_cast<int>(slot);
  }
  return -1;
}

ResidentGrid GridForSharedDevice(int resident_blocks, int ranks_on_device, int kernels_per_rank,
                                 int max_blocks) {
  ResidentGrid g{0, 0, false};
  if (resident_blocks <= 0 || ranks_on_device <= 0 || kernels_per_rank <= 0 || max_blocks <= 0) {
    return g;
  }
  g.kernels = ranks_on_device * kernels_per_rank;
  const int fit = resident_blocks / g.kernels;
  g.blocks = fit < max_blocks ? fit : max_blocks;
  g.capped = g.blocks < max_blocks;
  return g;
}

int MaxRanksOnDevice(int resident_blocks, int blocks, int kernels_per_rank) {
  if (resident_blocks <= 0 || blocks <= 0 || kernels_per_rank <= 0) return 0;
  return resident_blocks / (blocks * kernels_per_rank);
}

bool LaunchFailureDesyncs(int enqueued, const absl::Status& failure) {
  if (failure.ok()) return false;
  if (enqueued > 0) return true;
  return !absl::IsInvalidArgument(failure) && !absl::IsUnimplemented(failure);
}

}  // namespace commd::kernels
