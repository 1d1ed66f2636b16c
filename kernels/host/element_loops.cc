#include "kernels/host/element_loops.h"

#include <algorithm>
#include <cstring>

#include "kernels/element_ops.h"

namespace commd::kernels {
namespace {

template <typename T>
uint64_t CopyCountingNonFinite(const T* src, T* dst, size_t count) {
  uint64_t bad = 0;
  if (src == dst) {
    for (size_t i = 0; i < count; ++i) bad += IsNonFinite(src[i]) ? 1 : 0;
    return bad;
  }
  for (size_t i = 0; i < count; ++i) {
    const T v = src[i];
    dst[i] = v;
    bad += IsNonFinite(v) ? 1 : 0;
  }
  return bad;
}

// Accumulates a block at a time, source by source, so the inner loops run over contiguous
// memory; the per-element order is still source 0, 1, ..., as ReduceElement's.
template <typename T, ReduceOp Op>
void ReduceBlocks(const T* const* srcs, int nsrc, size_t count, T* dst, int world_size) {
  constexpr size_t kBlock = 1024;
  AccType<T> acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* s0 = srcs[0] + base;
    for (size_t j = 0; j < m; ++j) acc[j] = ToAcc(s0[j]);
    for (int p = 1; p < nsrc; ++p) {
      const T* sp = srcs[p] + base;
      for (size_t j = 0; j < m; ++j) acc[j] = Combine<Op>(acc[j], ToAcc(sp[j]));
    }
    T* out = dst + base;
    for (size_t j = 0; j < m; ++j) out[j] = FromAcc<T>(Finalize<Op>(acc[j], world_size));
  }
}

template <typename T>
void ReduceTyped(ReduceOp op, const std::byte* const* srcs, int nsrc, size_t first, size_t count,
                 std::byte* dst, int world_size) {
  constexpr int kMaxSources = 1024;  // common/symmetric_layout.h kMaxWorldSize
  const T* typed[kMaxSources];
  for (int p = 0; p < nsrc; ++p) typed[p] = reinterpret_cast<const T*>(srcs[p]) + first;
  T* out = reinterpret_cast<T*>(dst);
  switch (op) {
    case ReduceOp::kSum:
      return ReduceBlocks<T, ReduceOp::kSum>(typed, nsrc, count, out, world_size);
    case ReduceOp::kAvg:
      return ReduceBlocks<T, ReduceOp::kAvg>(typed, nsrc, count, out, world_size);
    case ReduceOp::kMin:
      return ReduceBlocks<T, ReduceOp::kMin>(typed, nsrc, count, out, world_size);
    case ReduceOp::kMax:
      return ReduceBlocks<T, ReduceOp::kMax>(typed, nsrc, count, out, world_size);
  }
}

}  // namespace

uint64_t CopyIn(DataType type, const std::byte* src, std::byte* dst, size_t count, NanCheck check) {
  if (check == NanCheck::kOff || !IsFloatingPoint(type)) {
    if (src != dst) std::memcpy(dst, src, count * DataTypeSize(type));
    return 0;
  }
  uint64_t bad = 0;
  DispatchType(type, [&]<typename T>() {
    bad = CopyCountingNonFinite(reinterpret_cast<const T*>(src), reinterpret_cast<T*>(dst), count);
  });
  return bad;
}

void ReduceInto(DataType type, ReduceOp op, const std::byte* const* srcs, int nsrc, size_t first,
                size_t count, std::byte* dst, int world_size) {
  DispatchType(
      type, [&]<typename T>() { ReduceTyped<T>(op, srcs, nsrc, first, count, dst, world_size); });
}

}  // namespace commd::kernels
