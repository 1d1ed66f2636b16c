// The CPU's loops over elements for the collectives: copy-in with the fused NaN/Inf count,
// and the rank-ordered reduction of several sources. Built on kernels/element_ops.h, whose
// per-element functions the CUDA kernels share.
//
//   uint64_t bad = CopyIn(DataType::kBFloat16, src, staging, count, NanCheck::kOn);
//   ReduceInto(DataType::kFloat32, ReduceOp::kSum, srcs, world, begin, count, out, world);
//
// Plain memory loops: no synchronisation, thread-compatible. Types and ops must be valid.
#ifndef COMMD_KERNELS_HOST_ELEMENT_LOOPS_H_
#define COMMD_KERNELS_HOST_ELEMENT_LOOPS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/types.h"

namespace commd::kernels {

// Copies `count` elements from `src` to `dst` (dst == src: no copy) and, with kOn and a
// floating-point type, returns how many were NaN or +-Inf, in the same pass; 0 otherwise.
uint64_t CopyIn(DataType type, const std::byte* src, std::byte* dst, size_t count, NanCheck check);

// dst[i] = reduction over p in [0, nsrc) of srcs[p][first + i], i in [0, count), in source
// order; kAvg divides by `world_size`. dst may be exactly a source's range (srcs[p] + first,
// the same elements: each block is read before it is written), else must not overlap one.
// An op not defined on the type (ReduceOpApplies, which callers check) writes nothing.
void ReduceInto(DataType type, ReduceOp op, const std::byte* const* srcs, int nsrc, size_t first,
                size_t count, std::byte* dst, int world_size);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_ELEMENT_LOOPS_H_
