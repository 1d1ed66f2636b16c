// Choice of all-reduce algorithm, and how two-shot and reduce-scatter split a tensor into
// one chunk per rank.
//
//   AllReduceThresholds t{.one_shot_max_read_bytes = config.one_shot_max_read_bytes()};
//   Algorithm a = ChooseAllReduceAlgorithm(count * DataTypeSize(dtype), count, world, t);
//
// Pure functions; thread-safe.
#ifndef COMMD_KERNELS_ALGORITHM_H_
#define COMMD_KERNELS_ALGORITHM_H_

#include <cstddef>

#include "kernels/host_device.h"
#include "kernels/types.h"

namespace commd::kernels {

struct AllReduceThresholds {
  // One-shot while each rank would read at most this much (bytes x world size); beyond it
  // the read traffic of one-shot grows with the world and two-shot wins. The default is the
  // daemon's (collectives.one_shot_max_read_bytes), from the crossover measured on the host.
  size_t one_shot_max_read_bytes = size_t{4} << 10;
  // Host groups on one node with more ranks than the node has CPUs: one-shot also while the
  // input is at most this many bytes (kernels::OversubscribedOneShotMaxBytes: what one
  // exchange carries), since there every hand-off may wait for a descheduled rank and such a
  // one-shot has one where two-shot has two. 0: no such rule.
  size_t oversubscribed_one_shot_max_bytes = 0;
};

// One-shot for a world of one, for fewer elements than ranks (two-shot chunks would be
// empty), while bytes x world_size <= one_shot_max_read_bytes and while bytes <=
// oversubscribed_one_shot_max_bytes; two-shot otherwise.
Algorithm ChooseAllReduceAlgorithm(size_t bytes, size_t count, int world_size,
                                   const AllReduceThresholds& thresholds);

// Chunk `index` of `count` elements split over `parts`: [begin, end). Chunks differ in size
// by at most one element, larger ones first; every rank computes the same split.
struct ChunkRange {
  size_t begin;
  size_t end;
};
COMMD_HOST_DEVICE constexpr ChunkRange Chunk(size_t count, int parts, int index) {
  const size_t n = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  const size_t base = count / n;
  const size_t extra = count % n;
  const size_t begin = i * base + (i < extra ? i : extra);
  return ChunkRange{begin, begin + base + (i < extra ? 1 : 0)};
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_ALGORITHM_H_
