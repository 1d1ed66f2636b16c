#include "kernels/algorithm.h"

namespace commd::kernels {

Algorithm ChooseAllReduceAlgorithm(size_t bytes, size_t count, int world_size,
                                   const AllReduceThresholds& thresholds) {
  if (world_size <= 1 || count < static_cast<size_t>(world_size)) return Algorithm::kOneShot;
  const size_t world = static_cast<size_t>(world_size);
  // bytes * world without overflow: compare against the threshold divided instead.
  if (bytes <= thresholds.one_shot_max_read_bytes / world) return Algorithm::kOneShot;
  if (bytes <= thresholds.oversubscribed_one_shot_max_bytes) return Algorithm::kOneShot;
  return Algorithm::kTwoShot;
}

}  // namespace commd::kernels
