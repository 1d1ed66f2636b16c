// fp16/bf16 conversions: exhaustive round trips, round-to-nearest-even at every tie,
// specials, and (where the compiler has _Float16) agreement with the compiler's conversion.
#include "kernels/float16.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

float F(uint32_t bits) { return BitsToFloat(bits); }

bool IsHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool IsBf16Nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// The value of a half bit pattern by the definition of binary16, in double.
double HalfValue(uint16_t h) {
  const double sign = (h & 0x8000) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}
double BFloat16Value(uint16_t b) {
  const double sign = (b & 0x8000) ? -1 : 1;
  const int exp = (b >> 7) & 0xff, mant = b & 0x7f;
  if (exp == 0xff) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -133);
  return sign * std::ldexp(128 + mant, exp - 134);
}

TEST(Float16Test, EveryHalfRoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const Half h{static_cast<uint16_t>(bits)};
    const float f = HalfToFloat(h);
    if (IsHalfNan(h.bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      ASSERT_EQ(std::signbit(f), (bits & 0x8000) != 0) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(f), HalfValue(h.bits)) << std::hex << bits;
    }
    ASSERT_EQ(FloatToHalf(f).bits, h.bits) << std::hex << bits;
  }
}

TEST(Float16Test, EveryBFloat16RoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const BFloat16 b{static_cast<uint16_t>(bits)};
    const float f = BFloat16ToFloat(b);
    if (IsBf16Nan(b.bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(f), BFloat16Value(b.bits)) << std::hex << bits;
    }
    ASSERT_EQ(FloatToBFloat16(f).bits, b.bits) << std::hex << bits;
  }
}

// For every pair of adjacent finite non-negative halves a < b: the midpoint goes to the one
// with an even mantissa, anything just off it to the nearer one. Includes subnormals, the
// subnormal/normal boundary and max -> Inf (65520 is the tie between 65504 and 2^16).
TEST(Float16Test, RoundsToNearestEvenAtEveryTie) {
  for (uint32_t a = 0; a < 0x7c00; ++a) {
    const uint32_t b = a + 1;
    const double lo = HalfValue(static_cast<uint16_t>(a));
    const double hi = b == 0x7c00 ? 65536.0 : HalfValue(static_cast<uint16_t>(b));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (a & 1) ? static_cast<uint16_t>(b) : static_cast<uint16_t>(a);
    ASSERT_EQ(FloatToHalf(mid).bits, even) << std::hex << a;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)).bits, a) << std::hex << a;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, INFINITY)).bits, b) << std::hex << a;
    ASSERT_EQ(FloatToHalf(-mid).bits, even | 0x8000) << std::hex << a;
  }
}

TEST(Float16Test, BFloat16RoundsToNearestEvenAtEveryTie) {
  for (uint32_t a = 0; a < 0x7f80; ++a) {
    const uint32_t b = a + 1;
    const uint32_t lo_bits = a << 16;
    const uint32_t mid_bits = lo_bits | 0x8000;  // exactly halfway to the next bf16
    const uint16_t even = (a & 1) ? static_cast<uint16_t>(b) : static_cast<uint16_t>(a);
    ASSERT_EQ(FloatToBFloat16(F(mid_bits)).bits, even) << std::hex << a;
    ASSERT_EQ(FloatToBFloat16(F(mid_bits - 1)).bits, a) << std::hex << a;
    ASSERT_EQ(FloatToBFloat16(F(mid_bits + 1)).bits, b) << std::hex << a;
    ASSERT_EQ(FloatToBFloat16(F(mid_bits | 0x80000000u)).bits, even | 0x8000) << std::hex << a;
  }
}

TEST(Float16Test, Specials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(inf).bits, 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf).bits, 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f).bits, 0x7c00);  // overflow
  EXPECT_EQ(FloatToHalf(65504.0f).bits, 0x7bff);
  EXPECT_EQ(FloatToHalf(-0.0f).bits, 0x8000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even: zero
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(FloatToHalf(1e-30f).bits, 0x0000);
  EXPECT_EQ(FloatToHalf(1.0f).bits, 0x3c00);
  EXPECT_TRUE(IsHalfNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN()).bits));
  // A NaN whose payload lives only in the low 13 bits stays NaN, not Inf.
  EXPECT_TRUE(IsHalfNan(FloatToHalf(F(0x7f800001u)).bits));
  EXPECT_TRUE(IsHalfNan(FloatToHalf(F(0xff800001u)).bits));
  EXPECT_EQ(FloatToHalf(F(0xff800001u)).bits & 0x8000, 0x8000);

  EXPECT_EQ(FloatToBFloat16(inf).bits, 0x7f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds up
  EXPECT_EQ(FloatToBFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
  EXPECT_EQ(FloatToBFloat16(F(0x00018000u)).bits, 0x0002);       // subnormal tie to even (up)
  EXPECT_TRUE(IsBf16Nan(FloatToBFloat16(F(0x7f800001u)).bits));  // not Inf
  EXPECT_TRUE(IsBf16Nan(FloatToBFloat16(F(0x7fffffffu)).bits));  // no carry into the sign
}

#if defined(__FLT16_MANT_DIG__)
// GCC's _Float16 conversion (libgcc or F16C) is an independent implementation of IEEE
// round-to-nearest-even.
TEST(Float16Test, AgreesWithCompilerFloat16OnRandomAndStructuredFloats) {
  std::mt19937_64 rng(12345);
  auto check = [](uint32_t bits) {
    const float f = F(bits);
    if (std::isnan(f)) return;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(FloatToHalf(f).bits, ref_bits) << std::hex << bits;
  };
  for (int i = 0; i < 4000000; ++i) check(static_cast<uint32_t>(rng()));
  // Every exponent in and around the half range with mantissas near the rounding points.
  for (uint32_t exp = 90; exp < 150; ++exp) {
    for (uint32_t low : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u, 0x3000u}) {
      for (uint32_t high = 0; high < 1024; ++high) {
        const uint32_t mant = (high << 13 | low) & 0x7fffff;
        check(exp << 23 | mant);
        check(0x80000000u | exp << 23 | mant);
      }
    }
  }
}
#endif

}  // namespace
}  // namespace commd::kernels
