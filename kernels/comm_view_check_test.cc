// The one check of a view, under rules of its own: each failure names the value and what is
// allowed, and a view that passes is left alone.
#include "kernels/comm_view_check.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

constexpr CommViewRules kRules{
    .max_world_size = 4,
    .needed_pad_slots = [](int world_size) { return static_cast<size_t>(3 * world_size); },
    .pad_layout = [](int world_size) { return absl::StrCat("3 x world size ", world_size); }};

class CommViewCheckTest : public ::testing::Test {
 protected:
  CommViewShape Shape() {
    return {.rank = 1, .world_size = 2, .data = data_, .pads = pads_, .pad_slots = 6};
  }
  std::byte bytes_[2] = {};
  uint32_t slots_[2] = {};
  std::byte* data_[2] = {&bytes_[0], &bytes_[1]};
  uint32_t* pads_[2] = {&slots_[0], &slots_[1]};
};

std::string Message(const absl::Status& s) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  return std::string(s.message());
}

TEST_F(CommViewCheckTest, AValidViewPasses) { EXPECT_TRUE(CheckCommView(Shape(), kRules).ok()); }

TEST_F(CommViewCheckTest, WorldSizeAndRankAgainstTheRules) {
  CommViewShape v = Shape();
  v.world_size = 5;
  EXPECT_EQ(Message(CheckCommView(v, kRules)), "world size 5 is out of range [1, 4]");
  v = Shape();
  v.rank = 2;
  EXPECT_EQ(Message(CheckCommView(v, kRules)), "rank 2 is out of range [0, 1]");
}

TEST_F(CommViewCheckTest, NullArraysAndPointersAreNamed) {
  CommViewShape v = Shape();
  v.pads = nullptr;
  EXPECT_TRUE(
      absl::StrContains(Message(CheckCommView(v, kRules)), "the view's pads array is null"));
  std::byte* data[2] = {data_[0], nullptr};
  v = Shape();
  v.data = data;
  EXPECT_TRUE(
      absl::StrContains(Message(CheckCommView(v, kRules)), "rank 1's data region pointer is null"));
  uint32_t* pads[2] = {nullptr, pads_[1]};
  v = Shape();
  v.pads = pads;
  EXPECT_TRUE(
      absl::StrContains(Message(CheckCommView(v, kRules)), "rank 0's signal pad pointer is null"));
}

TEST_F(CommViewCheckTest, TooSmallAPadSaysWhatItNeedsAndWhy) {
  CommViewShape v = Shape();
  v.pad_slots = 5;
  EXPECT_EQ(Message(CheckCommView(v, kRules)),
            "signal pad of 5 slots is too small; need at least 6 (3 x world size 2)");
}

}  // namespace
}  // namespace commd::kernels
