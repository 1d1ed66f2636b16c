// Every row of the vocabulary (commd/vocabulary.h) through every table made from it: the
// enums' values, the names both ways, the ring's op and dtype codes (common/control_block.h).
#include "commd/vocabulary.h"

#include <set>
#include <string>
#include <string_view>

#include "common/control_block.h"
#include "gtest/gtest.h"

namespace commd {
namespace {

TEST(VocabularyTest, EveryCollectiveRoundTrips) {
  std::set<std::string_view> torch, sdk, bench;
  for (int v = 0; v < kCollectiveOpCount; ++v) {
    const auto op = static_cast<CollectiveOp>(v);
    const vocabulary::CollectiveRow& r = CollectiveInfo(op);
    SCOPED_TRACE(std::string(r.sdk));
    EXPECT_EQ(r.op, op);
    EXPECT_TRUE(sdk.insert(r.sdk).second) << "SDK name used twice";
    EXPECT_TRUE(torch.insert(r.torch).second) << "torch name used twice";
    EXPECT_NE(*r.words, '\0');
    EXPECT_STREQ(CollectiveName(op), r.torch);
    if (r.bench != nullptr) EXPECT_TRUE(bench.insert(r.bench).second);
    // The entry the SDK records is a ring op of the same shape of data.
    const vocabulary::CollectiveRow& rec = CollectiveInfo(r.recorded_as);
    EXPECT_TRUE(rec.ring());
    EXPECT_EQ(rec.reduces(), r.reduces());
    // The ring's op codes are exactly the rows flagged kRing, and their torch names are the
    // ring's, found again by name; the others are not found (the recorder refuses them).
    EXPECT_EQ(r.ring(), v < int{kRecordOpCount});
    CollectiveOp back = CollectiveOp::kBarrier;
    EXPECT_EQ(CollectiveFromTorchName(r.torch, &back), r.ring());
    if (r.ring()) {
      EXPECT_EQ(back, op);
      EXPECT_STREQ(RecordOpTorchName(v), r.torch);
    }
    // Only rooted collectives name a root, only point-to-point ones a peer.
    EXPECT_FALSE(r.rooted() && r.point_to_point());
  }
  EXPECT_EQ(RecordOpTorchName(kRecordOpCount), nullptr);
  EXPECT_STREQ(CollectiveName(static_cast<CollectiveOp>(kCollectiveOpCount)), "?");
  CollectiveOp op;
  EXPECT_FALSE(CollectiveFromTorchName("allreduce", &op));
}

TEST(VocabularyTest, EveryDataTypeRoundTrips) {
  // The ring's dtype codes and sizes, an ABI: never renumbered.
  constexpr uint8_t kBytes[] = {4, 2, 2, 4, 8, 8, 1, 1, 1, 2, 1, 1};
  ASSERT_EQ(kDataTypeCount, static_cast<int>(std::size(kBytes)));
  std::set<std::string_view> names;
  int collective = 0;
  for (int v = 0; v < kDataTypeCount; ++v) {
    const auto t = static_cast<DataType>(v);
    const vocabulary::DataTypeRow& r = DataTypeInfo(t);
    SCOPED_TRACE(r.name);
    EXPECT_EQ(r.type, t);
    EXPECT_EQ(DataTypeSize(t), kBytes[v]);
    EXPECT_LE(v, 255) << "the ring keeps a dtype in one byte";
    EXPECT_TRUE(names.insert(r.name).second);
    EXPECT_TRUE(names.insert(r.scalar).second || std::string_view(r.scalar) == r.name);
    for (std::string name :
         {std::string(r.name), "torch." + std::string(r.name), std::string(r.scalar)}) {
      DataType back = DataType::kFloat32;
      EXPECT_TRUE(DataTypeFromName(name, &back)) << name;
      EXPECT_EQ(back, t) << name;
    }
    if (IsCollectiveType(t)) {
      EXPECT_EQ(kCollectiveTypes[collective++], t);
      for (int o = 0; o < kReduceOpCount; ++o) {
        const ReduceOp op = static_cast<ReduceOp>(o);
        // avg is undefined on bool, the bitwise ops on the floats (PyTorch refuses them too).
        const bool bitwise = op == ReduceOp::kBAnd || op == ReduceOp::kBOr || op == ReduceOp::kBXor;
        EXPECT_EQ(ReduceOpApplies(op, t), !(op == ReduceOp::kAvg && t == DataType::kBool) &&
                                              !(bitwise && IsFloatingPoint(t)))
            << r.name << " " << ReduceOpName(op);
      }
    } else {
      EXPECT_FALSE(ReduceOpApplies(ReduceOp::kSum, t));
    }
  }
  EXPECT_EQ(collective, kCollectiveTypeCount);
  EXPECT_EQ(DataTypeSize(static_cast<DataType>(kDataTypeCount)), 0u);
  EXPECT_STREQ(DataTypeName(static_cast<DataType>(-1)), "?");
  EXPECT_FALSE(IsCollectiveType(static_cast<DataType>(-1)));
  DataType t;
  EXPECT_FALSE(DataTypeFromName("float128", &t));
  // PyTorch's ScalarType names, what its flight recorder writes.
  EXPECT_STREQ(DataTypeInfo(DataType::kBFloat16).scalar, "BFloat16");
  EXPECT_STREQ(DataTypeInfo(DataType::kInt64).scalar, "Long");
}

TEST(VocabularyTest, EveryReduceOpRoundTrips) {
  std::set<std::string_view> names;
  for (int v = 0; v < kReduceOpCount; ++v) {
    const auto op = static_cast<ReduceOp>(v);
    SCOPED_TRACE(ReduceOpName(op));
    EXPECT_TRUE(names.insert(ReduceOpName(op)).second);
    ReduceOp back = ReduceOp::kMax;
    EXPECT_TRUE(ReduceOpFromName(ReduceOpName(op), &back));
    EXPECT_EQ(back, op);
  }
  ReduceOp op;
  EXPECT_FALSE(ReduceOpFromName("Sum", &op));
  EXPECT_STREQ(ReduceOpName(static_cast<ReduceOp>(kReduceOpCount)), "?");
}

}  // namespace
}  // namespace commd
