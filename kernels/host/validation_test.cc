// Invalid calls fail with INVALID_ARGUMENT naming the value and the allowed range, before
// any memory (data regions, pads, outputs) is touched. One process: no peer is needed since
// nothing may wait.
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "common/symmetric_layout.h"
#include "gtest/gtest.h"
#include "kernels/host/collectives.h"

namespace commd::kernels {
namespace {

constexpr int kWorld = 2;
constexpr size_t kDataBytes = 1024;

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int p = 0; p < kWorld; ++p) {
      regions_[p].assign(kDataBytes, std::byte{0x5a});
      pad_storage_[p].assign(SignalPadBytes(kWorld) / 4, 0);
      data_[p] = regions_[p].data();
      pads_[p] = pad_storage_[p].data();
    }
    view_ = HostCommView{.rank = 0,
                         .world_size = kWorld,
                         .data = data_,
                         .pads = pads_,
                         .data_bytes = kDataBytes,
                         .pad_slots = SignalPadBytes(kWorld) / 4,
                         .abort_word = nullptr,
                         .deadline = absl::Now() + absl::Seconds(1)};
    out_.assign(8192, std::byte{0x77});
  }

  // The call failed with INVALID_ARGUMENT mentioning every fragment, and touched nothing.
  void ExpectInvalid(const absl::Status& s, std::initializer_list<const char*> fragments) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    for (const char* f : fragments)
      EXPECT_TRUE(absl::StrContains(s.message(), f)) << s << " lacks " << f;
    for (int p = 0; p < kWorld; ++p) {
      for (std::byte b : regions_[p]) ASSERT_EQ(b, std::byte{0x5a}) << "data region " << p;
      for (uint32_t v : pad_storage_[p]) ASSERT_EQ(v, 0u) << "pad " << p;
    }
    for (std::byte b : out_) ASSERT_EQ(b, std::byte{0x77}) << "output";
  }

  std::vector<std::byte> regions_[kWorld];
  std::vector<uint32_t> pad_storage_[kWorld];
  std::byte* data_[kWorld];
  uint32_t* pads_[kWorld];
  HostCommView view_;
  std::vector<std::byte> out_;
  float in_[512] = {};
};

TEST_F(ValidationTest, CountLargerThanTheBuffer) {
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 257, DataType::kFloat32, ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOn, nullptr),
                {"1028 bytes", "1024 bytes"});
  // Reduce-scatter stages world_size x count.
  ExpectInvalid(ReduceScatter(view_, in_, out_.data(), 129, DataType::kFloat32, ReduceOp::kSum,
                              NanCheck::kOff, nullptr),
                {"1032 bytes", "1024"});
  ExpectInvalid(
      AllGather(view_, in_, out_.data(), SIZE_MAX / 2, DataType::kInt64, NanCheck::kOff, nullptr),
      {"overflows"});
  // Coalesced tensors that fit one by one but not together.
  const TensorArgs ts[2] = {{in_, out_.data(), 200, DataType::kFloat32},
                            {in_, out_.data() + 4096, 100, DataType::kFloat32}};
  ExpectInvalid(
      AllReduceCoalesced(view_, ts, ReduceOp::kSum, Algorithm::kTwoShot, NanCheck::kOff, nullptr),
      {"2 tensors", "1024 bytes"});
}

TEST_F(ValidationTest, WorldSizeAndRankOutOfRange) {
  HostCommView v = view_;
  v.world_size = 0;
  ExpectInvalid(Barrier(v), {"world size 0", "[1, 1024]"});
  v.world_size = kMaxWorldSize + 1;
  ExpectInvalid(Barrier(v), {"world size 1025"});
  v = view_;
  v.rank = 2;
  ExpectInvalid(AllReduce(v, in_, out_.data(), 4, DataType::kFloat32, ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"rank 2", "[0, 1]"});
  v.rank = -1;
  ExpectInvalid(Barrier(v), {"rank -1"});
}

TEST_F(ValidationTest, NullPointers) {
  HostCommView v = view_;
  v.data = nullptr;
  ExpectInvalid(Barrier(v), {"data array is null"});
  v = view_;
  std::byte* data_with_null[kWorld] = {data_[0], nullptr};
  v.data = data_with_null;
  ExpectInvalid(Barrier(v), {"rank 1's data region"});
  v = view_;
  v.pad_slots = 3;
  static_assert(SignalPadBytes(kWorld) / 4 == 4208);
  ExpectInvalid(Barrier(v),
                {"3 slots", "at least 4208 (",
                 "16 channels x world size 2, then an exchange area of one line and 4 slots of "
                 "4160 bytes"});
  ExpectInvalid(AllReduce(view_, nullptr, out_.data(), 4, DataType::kFloat32, ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"input is null"});
  ExpectInvalid(AllGather(view_, in_, nullptr, 4, DataType::kFloat32, NanCheck::kOff, nullptr),
                {"output is null"});
}

TEST_F(ValidationTest, BadEnumsAndPlacement) {
  // A type of the vocabulary the kernels have no case for, and a value outside it.
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 4, DataType::kFloat8E4M3, ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"data type float8_e4m3fn (10) is not one of float32, float16, bfloat16, int32, "
                 "int64, float64, int8, uint8, bool, int16"});
  // An op the type does not define: avg of bool (sum, min and max are or, and, or), a bitwise
  // op of a float.
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 4, DataType::kBool, ReduceOp::kAvg,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"all_reduce tensor 0: reduce op avg is not defined on bool; allowed on bool: "
                 "sum, min, max, product, band, bor, bxor"});
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 4, DataType::kFloat32, ReduceOp::kBXor,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"all_reduce tensor 0: reduce op bxor is not defined on float32; allowed on "
                 "float32: sum, avg, min, max, product"});
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 4, static_cast<DataType>(99), ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"data type 99 is not one of float32, float16, bfloat16, int32, int64, float64, "
                 "int8, uint8, bool, int16"});
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 4, DataType::kFloat32, static_cast<ReduceOp>(9),
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"reduce op 9 is not one of sum, avg, min, max, product, band, bor, bxor"});
  ExpectInvalid(AllReduce(view_, in_, out_.data(), 4, DataType::kFloat32, ReduceOp::kSum,
                          static_cast<Algorithm>(5), NanCheck::kOff, nullptr),
                {"algorithm 5"});
  // Output in a peer's data region, or in the own one for an outside input.
  ExpectInvalid(AllReduce(view_, in_, data_[1], 4, DataType::kFloat32, ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"output overlaps rank 1"});
  ExpectInvalid(AllReduce(view_, in_, data_[0], 4, DataType::kFloat32, ReduceOp::kSum,
                          Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"output overlaps rank 0"});
  // Input straddling the end of the own region.
  ExpectInvalid(AllReduce(view_, data_[0] + kDataBytes - 8, out_.data(), 4, DataType::kFloat32,
                          ReduceOp::kSum, Algorithm::kOneShot, NanCheck::kOff, nullptr),
                {"input overlaps rank 0"});
  // Misaligned.
  ExpectInvalid(
      AllReduce(view_, reinterpret_cast<std::byte*>(in_) + 2, out_.data(), 4, DataType::kFloat32,
                ReduceOp::kSum, Algorithm::kOneShot, NanCheck::kOff, nullptr),
      {"not aligned to the element size 4"});
  // Mixed in-place and outside inputs in one coalesced call.
  const TensorArgs mixed[2] = {{data_[0], data_[0], 4, DataType::kFloat32},
                               {in_, out_.data(), 4, DataType::kFloat32}};
  ExpectInvalid(AllReduceCoalesced(view_, mixed, ReduceOp::kSum, Algorithm::kOneShot,
                                   NanCheck::kOff, nullptr),
                {"all in place or none"});
  const TensorArgs overlapping[2] = {{data_[0], data_[0], 8, DataType::kFloat32},
                                     {data_[0] + 16, data_[0] + 16, 8, DataType::kFloat32}};
  ExpectInvalid(AllReduceCoalesced(view_, overlapping, ReduceOp::kSum, Algorithm::kOneShot,
                                   NanCheck::kOff, nullptr),
                {"overlap at data offset 16"});
}

TEST_F(ValidationTest, BroadcastAndAllToAll) {
  ExpectInvalid(Broadcast(view_, in_, 4, DataType::kFloat32, 2, NanCheck::kOff, nullptr),
                {"broadcast: root 2", "out of range [0, 1]"});
  ExpectInvalid(Broadcast(view_, in_, 4, DataType::kFloat32, -1, NanCheck::kOff, nullptr),
                {"root -1", "[0, 1]"});
  ExpectInvalid(Broadcast(view_, in_, 257, DataType::kFloat32, 0, NanCheck::kOff, nullptr),
                {"broadcast tensor 0", "1028 bytes", "1024 bytes"});
  ExpectInvalid(Broadcast(view_, in_, SIZE_MAX / 4, DataType::kInt64, 0, NanCheck::kOff, nullptr),
                {"broadcast", "overflows"});
  // The buffer straddles the end of the own data region, or lies in a peer's.
  ExpectInvalid(Broadcast(view_, data_[0] + kDataBytes - 8, 4, DataType::kFloat32, 0,
                          NanCheck::kOff, nullptr),
                {"input overlaps rank 0"});
  ExpectInvalid(Broadcast(view_, data_[1], 4, DataType::kFloat32, 1, NanCheck::kOff, nullptr),
                {"input overlaps rank 1"});
  // All-to-all stages and writes world_size x count.
  ExpectInvalid(AllToAll(view_, in_, out_.data(), 129, DataType::kFloat32, NanCheck::kOff, nullptr),
                {"all_to_all tensor 0", "1032 bytes", "1024"});
  ExpectInvalid(
      AllToAll(view_, in_, out_.data(), SIZE_MAX / 4, DataType::kInt32, NanCheck::kOff, nullptr),
      {"all_to_all", "overflows", "2^64"});
  ExpectInvalid(AllToAll(view_, in_, data_[1], 4, DataType::kFloat32, NanCheck::kOff, nullptr),
                {"output overlaps rank 1", "allowed: memory outside every data region"});
  ExpectInvalid(AllToAll(view_, data_[0], data_[0], 4, DataType::kFloat32, NanCheck::kOff, nullptr),
                {"output overlaps rank 0"});
  ExpectInvalid(
      AllToAll(view_, in_, out_.data(), 4, DataType::kFloat8E5M2, NanCheck::kOff, nullptr),
      {"data type float8_e5m2 (11) is not one of float32, float16, bfloat16, int32, int64, "
       "float64, int8, uint8, bool, int16"});
}

TEST_F(ValidationTest, EmptyCollectiveIsANoOp) {
  CollectiveResult r{.nonfinite_count = 9};
  EXPECT_TRUE(AllReduce(view_, nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum,
                        Algorithm::kOneShot, NanCheck::kOn, &r)
                  .ok());
  EXPECT_EQ(r.nonfinite_count, 0u);
  EXPECT_TRUE(Broadcast(view_, nullptr, 0, DataType::kInt32, 1, NanCheck::kOn, &r).ok());
  EXPECT_TRUE(AllToAll(view_, nullptr, nullptr, 0, DataType::kInt32, NanCheck::kOn, &r).ok());
  for (uint32_t v : pad_storage_[1]) EXPECT_EQ(v, 0u);
}

}  // namespace
}  // namespace commd::kernels
