#include "client/src/group_aborted.h"

#include "gtest/gtest.h"

namespace commd {
namespace {

TEST(GroupAbortedErrorTest, ReasonAndWhatTheCallSaw) {
  const absl::Status s = GroupAbortedError("tp", "stuck: collective 3", "abort word set");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "group tp aborted stuck: collective 3 (abort word set)");
}

TEST(GroupAbortedErrorTest, ReasonAlone) {
  EXPECT_EQ(GroupAbortedError("tp", "dead: rank 1").message(), "group tp aborted dead: rank 1");
}

// The abort event's text when the control block carries no reason yet.
TEST(GroupAbortedErrorTest, DetailAlone) {
  EXPECT_EQ(GroupAbortedError("dp", "", "operator request").message(),
            "group dp aborted (operator request)");
}

}  // namespace
}  // namespace commd
