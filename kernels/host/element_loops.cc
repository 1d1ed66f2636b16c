#include "kernels/host/element_loops.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/symmetric_layout.h"
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
[[gnu::always_inline]] inline void ReduceBlocks(const T* const* srcs, int nsrc, size_t count,
                                                T* dst, int world_size) {
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

// When the accumulator is the element type itself (float, int64), reduces straight into the
// output, one pass per source over a block that stays in L1: out = s0 op s1, then out op= sp.
// Same per-element order as ReduceBlocks, so bit-identical results, but no staging array and
// loops simple enough for the compiler to vectorise. `dst` may be one of the sources at the
// same index (two-shot reduces into its own region), so nothing is declared restrict; when
// that source comes after the first two, its block is saved before `out` overwrites it.
template <typename T, ReduceOp Op>
[[gnu::always_inline]] inline void ReduceDirect(const T* const* srcs, int nsrc, size_t count,
                                                T* dst, int world_size) {
  constexpr size_t kBlock = 2048;
  int alias = -1;
  for (int p = 2; p < nsrc; ++p) {
    if (srcs[p] == dst) alias = p;
  }
  alignas(64) T saved[kBlock];  // used only when alias >= 0
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* s0 = srcs[0] + base;
    T* out = dst + base;
    if (alias >= 0) std::memcpy(saved, out, m * sizeof(T));
    if (nsrc == 1) {
      if (out != s0) std::memcpy(out, s0, m * sizeof(T));
    } else {
      const T* s1 = srcs[1] + base;
      for (size_t j = 0; j < m; ++j) out[j] = Combine<Op>(s0[j], s1[j]);
    }
    for (int p = 2; p < nsrc; ++p) {
      const T* sp = p == alias ? saved : srcs[p] + base;
      for (size_t j = 0; j < m; ++j) out[j] = Combine<Op>(out[j], sp[j]);
    }
    if constexpr (Op == ReduceOp::kAvg) {
      for (size_t j = 0; j < m; ++j) out[j] = Finalize<Op>(out[j], world_size);
    }
  }
}

#if defined(__x86_64__)
// fp16 sum/avg with the CPU's F16C conversions, 8 elements at a time: the portable
// conversions branch per element and run ~20x slower than float. Same float accumulation
// order and round-to-nearest-even as ReduceBlocks; for NaN the results agree too, because
// the float addition quiets a NaN on both paths (so it takes 2+ sources and sum or avg).
// Returns the elements done (a multiple of 8); the caller finishes the tail.
__attribute__((target("avx2,f16c"))) size_t ReduceHalfF16c(const Half* const* srcs, int nsrc,
                                                           size_t count, Half* dst, bool avg,
                                                           int world_size) {
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(world_size));
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(srcs[0] + i)));
    for (int p = 1; p < nsrc; ++p) {
      acc = _mm256_add_ps(
          acc, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(srcs[p] + i))));
    }
    if (avg) acc = _mm256_div_ps(acc, divisor);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

__attribute__((target("avx2"))) inline __m256 WidenBFloat16(const BFloat16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// bf16 sum/avg, 8 elements at a time with AVX2: widening is a shift, narrowing the same
// round-to-nearest-even and NaN rule as FloatToBFloat16, as integer vector operations.
__attribute__((target("avx2"))) size_t ReduceBFloat16Avx2(const BFloat16* const* srcs, int nsrc,
                                                          size_t count, BFloat16* dst, bool avg,
                                                          int world_size) {
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(world_size));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i round_bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i low7 = _mm256_set1_epi32(0x7f);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc = WidenBFloat16(srcs[0] + i);
    for (int p = 1; p < nsrc; ++p) acc = _mm256_add_ps(acc, WidenBFloat16(srcs[p] + i));
    if (avg) acc = _mm256_div_ps(acc, divisor);
    const __m256i f = _mm256_castps_si256(acc);
    const __m256i top = _mm256_srli_epi32(f, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(f, round_bias), _mm256_and_si256(top, one)), 16);
    const __m256i no_payload = _mm256_cmpeq_epi32(_mm256_and_si256(top, low7), zero);
    const __m256i nan_value = _mm256_or_si256(top, _mm256_and_si256(no_payload, quiet));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(f, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, nan_value, is_nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  return i;
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

bool HaveF16c() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return have;
}
#endif

// The portable loops, compiled twice: for the baseline ISA (SSE2 on x86-64) and, picked at run
// time, for AVX2. element_loops.cc is built with -O3 (kernels/CMakeLists.txt, BUILD.bazel) so
// that GCC vectorises both; at -O2 its cheap cost model leaves ReduceDirect scalar (it will
// not add the run-time alias checks). kernels_host_vectorised_loops_test disassembles the
// library and fails if the float or int64 sum loops lose their packed instructions.
template <typename T, ReduceOp Op>
[[gnu::always_inline]] inline void ReducePortable(const T* const* srcs, int nsrc, size_t count,
                                                  T* dst, int world_size) {
  if constexpr (std::is_same_v<AccType<T>, T>) {
    ReduceDirect<T, Op>(srcs, nsrc, count, dst, world_size);
  } else {
    ReduceBlocks<T, Op>(srcs, nsrc, count, dst, world_size);
  }
}

// Not inlined, so that kernels_host_vectorised_loops_test finds it by name.
template <typename T, ReduceOp Op>
[[gnu::noinline]] void ReduceBaseline(const T* const* srcs, int nsrc, size_t count, T* dst,
                                      int world_size) {
  ReducePortable<T, Op>(srcs, nsrc, count, dst, world_size);
}

#if defined(__x86_64__)
template <typename T, ReduceOp Op>
[[gnu::noinline]] __attribute__((target("avx2"))) void ReduceAvx2(const T* const* srcs, int nsrc,
                                                                  size_t count, T* dst,
                                                                  int world_size) {
  ReducePortable<T, Op>(srcs, nsrc, count, dst, world_size);
}
#endif

template <typename T, ReduceOp Op>
void Reduce(const T* const* srcs, int nsrc, size_t count, T* dst, int world_size) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, Half> && (Op == ReduceOp::kSum || Op == ReduceOp::kAvg)) {
    if (nsrc >= 2 && HaveF16c()) {
      const size_t done = ReduceHalfF16c(srcs, nsrc, count, dst, Op == ReduceOp::kAvg, world_size);
      if (done == count) return;
      const T* rest[kMaxWorldSize];
      for (int p = 0; p < nsrc; ++p) rest[p] = srcs[p] + done;
      return ReduceBlocks<T, Op>(rest, nsrc, count - done, dst + done, world_size);
    }
  }
  if constexpr (std::is_same_v<T, BFloat16> && (Op == ReduceOp::kSum || Op == ReduceOp::kAvg)) {
    if (nsrc >= 2 && HaveAvx2()) {
      const size_t done =
          ReduceBFloat16Avx2(srcs, nsrc, count, dst, Op == ReduceOp::kAvg, world_size);
      if (done == count) return;
      const T* rest[kMaxWorldSize];
      for (int p = 0; p < nsrc; ++p) rest[p] = srcs[p] + done;
      return ReduceBlocks<T, Op>(rest, nsrc, count - done, dst + done, world_size);
    }
  }
  if (HaveAvx2()) return ReduceAvx2<T, Op>(srcs, nsrc, count, dst, world_size);
#endif
  ReduceBaseline<T, Op>(srcs, nsrc, count, dst, world_size);
}

template <typename T>
void ReduceTyped(ReduceOp op, const std::byte* const* srcs, int nsrc, size_t first, size_t count,
                 std::byte* dst, int world_size) {
  const T* typed[kMaxWorldSize];  // a source per rank at most
  for (int p = 0; p < nsrc; ++p) typed[p] = reinterpret_cast<const T*>(srcs[p]) + first;
  T* out = reinterpret_cast<T*>(dst);
  DispatchReduceOp<T>(op,
                      [&]<ReduceOp Op>() { Reduce<T, Op>(typed, nsrc, count, out, world_size); });
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
