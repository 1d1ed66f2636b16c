// Element operations, the CPU element loops built on them, type metadata and algorithm choice.
#include "kernels/element_ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/algorithm.h"
#include "kernels/host/element_loops.h"
#include "kernels/types.h"

namespace commd::kernels {
namespace {

TEST(TypesTest, SizesAndNames) {
  EXPECT_EQ(DataTypeSize(DataType::kFloat32), 4u);
  EXPECT_EQ(DataTypeSize(DataType::kFloat16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kBFloat16), 2u);
  EXPECT_EQ(DataTypeSize(DataType::kInt32), 4u);
  EXPECT_EQ(DataTypeSize(DataType::kInt64), 8u);
  EXPECT_EQ(DataTypeSize(static_cast<DataType>(99)), 0u);
  EXPECT_STREQ(DataTypeName(DataType::kBFloat16), "bfloat16");
  EXPECT_STREQ(ReduceOpName(ReduceOp::kAvg), "avg");
  EXPECT_STREQ(AlgorithmName(Algorithm::kTwoShot), "two_shot");
  EXPECT_STREQ(AlgorithmWords(Algorithm::kOneShot),
               "one-shot (every rank reads all peers' inputs)");
  EXPECT_STREQ(DataTypeName(static_cast<DataType>(-1)), "?");
  EXPECT_FALSE(IsValid(static_cast<ReduceOp>(kReduceOpCount)));
}

TEST(ElementOpsTest, CombineAndFinalize) {
  EXPECT_EQ((Combine<ReduceOp::kSum>(1.5f, 2.25f)), 3.75f);
  EXPECT_EQ((Combine<ReduceOp::kMin>(1.5f, -2.0f)), -2.0f);
  EXPECT_EQ((Combine<ReduceOp::kMax>(int64_t{-7}, int64_t{3})), 3);
  EXPECT_EQ((Finalize<ReduceOp::kAvg>(9.0f, 4)), 2.25f);
  EXPECT_EQ((Finalize<ReduceOp::kAvg>(int64_t{-7}, 2)), -3);  // truncates toward zero
  EXPECT_EQ((Finalize<ReduceOp::kSum>(int64_t{-7}, 2)), -7);
  EXPECT_EQ((Combine<ReduceOp::kProduct>(1.5f, -2.0f)), -3.0f);
  // int64 products wrap: 2^62 * 4 is 0 in the low 64 bits; int8's -128 * -1 stores as -128.
  EXPECT_EQ((Combine<ReduceOp::kProduct>(int64_t{1} << 62, int64_t{4})), 0);
  EXPECT_EQ(FromAcc<int8_t>(Combine<ReduceOp::kProduct>(ToAcc(int8_t{-128}), ToAcc(int8_t{-1}))),
            int8_t{-128});
  // The bitwise ops on the sign-extended accumulator keep the element's low bits.
  EXPECT_EQ(FromAcc<int8_t>(Combine<ReduceOp::kBAnd>(ToAcc(int8_t{-1}), ToAcc(int8_t{5}))), 5);
  EXPECT_EQ(FromAcc<uint8_t>(Combine<ReduceOp::kBOr>(ToAcc(uint8_t{0xF0}), ToAcc(uint8_t{0x0F}))),
            0xFF);
  EXPECT_EQ(FromAcc<int16_t>(Combine<ReduceOp::kBXor>(ToAcc(int16_t{-1}), ToAcc(int16_t{0x00FF}))),
            int16_t{-256});
  // bool: any nonzero byte is true; product is and, bxor is xor.
  EXPECT_EQ(FromAcc<Bool8>(Combine<ReduceOp::kProduct>(ToAcc(Bool8{7}), ToAcc(Bool8{2}))).bits, 1);
  EXPECT_EQ(FromAcc<Bool8>(Combine<ReduceOp::kBXor>(ToAcc(Bool8{7}), ToAcc(Bool8{2}))).bits, 0);
  EXPECT_EQ(FromAcc<Bool8>(Combine<ReduceOp::kBAnd>(ToAcc(Bool8{4}), ToAcc(Bool8{0}))).bits, 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Combine<ReduceOp::kMin>(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(Combine<ReduceOp::kMin>(1.0f, nan)));
  EXPECT_TRUE(std::isnan(Combine<ReduceOp::kMax>(1.0f, nan)));
  EXPECT_TRUE(std::isnan(Combine<ReduceOp::kMax>(nan, 1.0f)));
  // Integer sums wrap instead of overflowing.
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ((Combine<ReduceOp::kSum>(big, int64_t{1})), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(FromAcc<int32_t>(int64_t{0x7fffffff} + 1), std::numeric_limits<int32_t>::min());
  // The narrow integers accumulate in int64 and keep the low bits: 100 + 100 in int8 is -56,
  // 200 + 100 in uint8 is 44, and avg divides before it wraps.
  const int8_t i8[2] = {100, 100};
  const int8_t* i8p[2] = {&i8[0], &i8[1]};
  EXPECT_EQ((ReduceElement<int8_t, ReduceOp::kSum>(i8p, 2, 0, 2)), -56);
  EXPECT_EQ((ReduceElement<int8_t, ReduceOp::kAvg>(i8p, 2, 0, 2)), 100);
  const uint8_t u8[2] = {200, 100};
  const uint8_t* u8p[2] = {&u8[0], &u8[1]};
  EXPECT_EQ((ReduceElement<uint8_t, ReduceOp::kSum>(u8p, 2, 0, 2)), 44);
  EXPECT_EQ((ReduceElement<uint8_t, ReduceOp::kMin>(u8p, 2, 0, 2)), 100);
  const int16_t i16[2] = {-32768, -1};
  const int16_t* i16p[2] = {&i16[0], &i16[1]};
  EXPECT_EQ((ReduceElement<int16_t, ReduceOp::kSum>(i16p, 2, 0, 2)), 32767);
  // bool: any nonzero byte is true; sum is or, min and, max or; results are 0 or 1.
  const Bool8 b[3] = {{0}, {7}, {255}};
  const Bool8* tf[2] = {&b[1], &b[0]};
  const Bool8* tt[2] = {&b[1], &b[2]};
  EXPECT_EQ((ReduceElement<Bool8, ReduceOp::kSum>(tf, 2, 0, 2).bits), 1);
  EXPECT_EQ((ReduceElement<Bool8, ReduceOp::kSum>(tt, 2, 0, 2).bits), 1);
  EXPECT_EQ((ReduceElement<Bool8, ReduceOp::kMin>(tf, 2, 0, 2).bits), 0);
  EXPECT_EQ((ReduceElement<Bool8, ReduceOp::kMin>(tt, 2, 0, 2).bits), 1);
  EXPECT_EQ((ReduceElement<Bool8, ReduceOp::kMax>(tf, 2, 0, 2).bits), 1);
  // fp16/bf16 accumulate in float: 2048 + 1 is not representable in half but the sum of
  // 2048 + 1 + 1 in float is, and rounds to 2050.
  const Half h2048 = FloatToHalf(2048), h1 = FloatToHalf(1);
  const Half srcs_h[3] = {h2048, h1, h1};
  const Half* ptrs[3] = {&srcs_h[0], &srcs_h[1], &srcs_h[2]};
  EXPECT_EQ(HalfToFloat(ReduceElement<Half, ReduceOp::kSum>(ptrs, 3, 0, 3)), 2050.0f);
}

TEST(ElementOpsTest, NonFinite) {
  EXPECT_TRUE(IsNonFinite(std::numeric_limits<float>::infinity()));
  EXPECT_TRUE(IsNonFinite(-std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(IsNonFinite(std::numeric_limits<float>::max()));
  EXPECT_FALSE(IsNonFinite(std::numeric_limits<float>::denorm_min()));
  EXPECT_TRUE(IsNonFinite(Half{0x7c00}));
  EXPECT_TRUE(IsNonFinite(Half{0xfe01}));
  EXPECT_FALSE(IsNonFinite(Half{0x7bff}));
  EXPECT_TRUE(IsNonFinite(BFloat16{0xff80}));
  EXPECT_FALSE(IsNonFinite(BFloat16{0x7f7f}));
}

// The CPU's blocked loop must give exactly ReduceElement's results (the CUDA kernels use
// ReduceElement), across block boundaries, for any source count, with dst aliasing a source.
template <typename T>
void CheckLoopMatchesElement(std::mt19937_64& rng) {
  constexpr DataType kType = ElementTraits<T>::kType;
  constexpr size_t kCount = 2500;
  for (int n = 1; n <= 9; ++n) {
    std::vector<std::vector<T>> data(n, std::vector<T>(kCount));
    for (auto& v : data) {
      for (T& x : v) {
        uint64_t bits = rng();
        if constexpr (std::is_same_v<T, float>) {
          x = static_cast<float>(static_cast<int64_t>(bits % 2000001) - 1000000) / 977.0f;
        } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
          x = T{static_cast<uint16_t>(bits & 0xbfff)};  // finite and NaN-free mostly
          if (IsNonFinite(x)) x.bits = 0x3c00;
        } else if constexpr (std::is_same_v<T, Bool8>) {
          x = Bool8{static_cast<uint8_t>(bits % 3 == 0 ? 0 : bits)};  // true: any nonzero byte
        } else {
          x = static_cast<T>(bits);
        }
      }
    }
    std::vector<const std::byte*> srcs;
    std::vector<const T*> typed;
    for (auto& v : data) {
      srcs.push_back(reinterpret_cast<const std::byte*>(v.data()));
      typed.push_back(v.data());
    }
    for (int o = 0; o < kReduceOpCount; ++o) {
      const auto op = static_cast<ReduceOp>(o);
      if (!ReduceOpApplies(op, kType)) continue;
      std::vector<T> want(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        DispatchReduceOp<T>(
            op, [&]<ReduceOp Op>() { want[i] = ReduceElement<T, Op>(typed.data(), n, i, n); });
      }
      std::vector<T> got(kCount);
      ReduceInto(kType, op, srcs.data(), n, 0, kCount, reinterpret_cast<std::byte*>(got.data()), n);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kCount * sizeof(T)), 0)
          << DataTypeName(kType) << " " << ReduceOpName(op) << " n=" << n;
      // A sub-range written over the last source's own elements.
      std::vector<T> saved = data[n - 1];
      ReduceInto(kType, op, srcs.data(), n, 1000, 1400,
                 reinterpret_cast<std::byte*>(data[n - 1].data() + 1000), n);
      ASSERT_EQ(std::memcmp(data[n - 1].data() + 1000, want.data() + 1000, 1400 * sizeof(T)), 0)
          << DataTypeName(kType) << " " << ReduceOpName(op) << " n=" << n << " aliased";
      data[n - 1] = saved;
    }
  }
}

TEST(ElementLoopsTest, ReduceIntoMatchesReduceElement) {
  std::mt19937_64 rng(99);
  CheckLoopMatchesElement<float>(rng);
  CheckLoopMatchesElement<Half>(rng);
  CheckLoopMatchesElement<BFloat16>(rng);
  CheckLoopMatchesElement<int32_t>(rng);
  CheckLoopMatchesElement<int64_t>(rng);
  CheckLoopMatchesElement<int8_t>(rng);
  CheckLoopMatchesElement<uint8_t>(rng);
  CheckLoopMatchesElement<int16_t>(rng);
  CheckLoopMatchesElement<Bool8>(rng);
}

TEST(ElementLoopsTest, CopyInCountsNonFiniteInOnePass) {
  std::vector<float> in(1000, 1.0f), out(1000, 0.0f);
  in[3] = std::numeric_limits<float>::quiet_NaN();
  in[999] = -std::numeric_limits<float>::infinity();
  const auto* src = reinterpret_cast<const std::byte*>(in.data());
  auto* dst = reinterpret_cast<std::byte*>(out.data());
  EXPECT_EQ(CopyIn(DataType::kFloat32, src, dst, 1000, NanCheck::kOn), 2u);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 4000), 0);
  EXPECT_EQ(CopyIn(DataType::kFloat32, src, dst, 1000, NanCheck::kOff), 0u);
  // In place: only the scan.
  EXPECT_EQ(CopyIn(DataType::kFloat32, dst, dst, 1000, NanCheck::kOn), 2u);
  // Integers are never counted.
  EXPECT_EQ(CopyIn(DataType::kInt32, src, dst, 1000, NanCheck::kOn), 0u);
}

TEST(AlgorithmTest, ChoiceBySizeAndWorld) {
  const AllReduceThresholds t{.one_shot_max_read_bytes = 1 << 20};
  EXPECT_EQ(ChooseAllReduceAlgorithm(size_t{1} << 30, 1 << 28, 1, t), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm(12, 3, 8, t), Algorithm::kOneShot);  // count < world
  EXPECT_EQ(ChooseAllReduceAlgorithm(128 << 10, 32 << 10, 8, t), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm((128 << 10) + 4, (32 << 10) + 1, 8, t), Algorithm::kTwoShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm(256 << 10, 64 << 10, 2, t), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm(256 << 10, 64 << 10, 8, t), Algorithm::kTwoShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm(SIZE_MAX, SIZE_MAX / 4, 8, t), Algorithm::kTwoShot);
  const AllReduceThresholds never{.one_shot_max_read_bytes = 0};
  EXPECT_EQ(ChooseAllReduceAlgorithm(64, 16, 4, never), Algorithm::kTwoShot);
  // Ranks that outnumber the CPUs: one-shot up to what one exchange carries, whatever the
  // read bound.
  const AllReduceThresholds crowded{.one_shot_max_read_bytes = 4096,
                                    .oversubscribed_one_shot_max_bytes = 4128};
  EXPECT_EQ(ChooseAllReduceAlgorithm(4096, 1024, 4, crowded), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm(4128, 1032, 4, crowded), Algorithm::kOneShot);
  EXPECT_EQ(ChooseAllReduceAlgorithm(4132, 1033, 4, crowded), Algorithm::kTwoShot);
}

TEST(AlgorithmTest, ChunksCoverEveryElementOnce) {
  for (size_t count : {0u, 1u, 7u, 8u, 9u, 1000u, 1001u}) {
    for (int parts : {1, 2, 3, 8}) {
      size_t next = 0, smallest = SIZE_MAX, largest = 0;
      for (int i = 0; i < parts; ++i) {
        const ChunkRange c = Chunk(count, parts, i);
        EXPECT_EQ(c.begin, next);
        next = c.end;
        smallest = std::min(smallest, c.end - c.begin);
        largest = std::max(largest, c.end - c.begin);
      }
      EXPECT_EQ(next, count);
      EXPECT_LE(largest - smallest, 1u);
    }
  }
}

}  // namespace
}  // namespace commd::kernels
