// fp16 (IEEE binary16) and bf16 (bfloat16) storage types and their conversions to and from
// float, written with integer operations so host builds need no CUDA header and the CPU and
// GPU paths round identically.
//
//   const Half h = FloatToHalf(1.0f / 3);      // round to nearest, ties to even
//   const float back = HalfToFloat(h);         // exact
//
// Float to half/bf16: round to nearest even; overflow gives +-Inf; subnormal results are
// rounded correctly; NaN stays NaN with its sign and the top payload bits (a payload that
// would vanish becomes the quiet bit), so every half/bf16 bit pattern survives a round trip
// through float unchanged. Half/bf16 to float is exact.
#ifndef COMMD_KERNELS_FLOAT16_H_
#define COMMD_KERNELS_FLOAT16_H_

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace commd::kernels {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

COMMD_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

COMMD_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Shifts `m` right by `shift` (1..31) rounding to nearest, ties to even.
COMMD_HOST_DEVICE inline uint32_t ShiftRightRne(uint32_t m, uint32_t shift) {
  const uint32_t rest = m & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  uint32_t r = m >> shift;
  if (rest > halfway || (rest == halfway && (r & 1u))) ++r;
  return r;
}

COMMD_HOST_DEVICE inline Half FloatToHalf(float value) {
  const uint32_t f = FloatBits(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // Inf or NaN
    uint32_t payload = (a & 0x7fffffu) >> 13;
    if (a != 0x7f800000u && payload == 0) payload = 0x200u;
    return Half{static_cast<uint16_t>(sign | 0x7c00u | payload)};
  }
  // 65520 is halfway between the largest half (65504) and 65536; ties to even go up.
  if (a >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};
  if (a >= 0x38800000u) {  // normal half: rebias the exponent, round 13 mantissa bits away
    const uint32_t rebased = a - 0x38000000u;
    return Half{static_cast<uint16_t>(sign | ShiftRightRne(rebased, 13))};
  }
  // Subnormal half (or zero): the value in units of 2^-24 is m * 2^(e - 126).
  const uint32_t e = a >> 23;
  if (e < 102) return Half{static_cast<uint16_t>(sign)};  // below 2^-25: rounds to zero
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return Half{static_cast<uint16_t>(sign | ShiftRightRne(m, 126 - e))};
}

COMMD_HOST_DEVICE inline float HalfToFloat(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24 is exact in float.
  const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return BitsToFloat(sign | FloatBits(magnitude));
}

COMMD_HOST_DEVICE inline BFloat16 FloatToBFloat16(float value) {
  const uint32_t f = FloatBits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload bits
    uint32_t top = f >> 16;
    if ((top & 0x7fu) == 0) top |= 0x40u;
    return BFloat16{static_cast<uint16_t>(top)};
  }
  // Round to nearest even on the low 16 bits; a carry into the exponent is the right
  // result, up to and including +-Inf.
  const uint32_t rounded = f + 0x7fffu + ((f >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(rounded >> 16)};
}

COMMD_HOST_DEVICE inline float BFloat16ToFloat(BFloat16 b) {
  return BitsToFloat(static_cast<uint32_t>(b.bits) << 16);
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_FLOAT16_H_
