// The symmetric-allocation rounds of GroupRegistry (symmetric_rounds.cc), driven through fake
// pending calls in formed groups.
#include <signal.h>

#include "absl/strings/match.h"
#include "daemon/groups/group_registry.h"
#include "daemon/groups/group_test_util.h"
#include "gtest/gtest.h"

namespace commd::groups {
namespace {

using testing::Asking;
using testing::Harness;

constexpr absl::Duration kWait = absl::Seconds(20);  // a bound, not a timing: timers run late

class SymmetricRoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    id_ = h_.Form("g", 2);
    ASSERT_NE(id_, 0u);
  }
  std::shared_ptr<const server::Session> Rank(int r) {
    return h_.Session("g/r" + std::to_string(r));
  }
  uint64_t MemoryBytes() { return h_.groups().Snapshot()->groups.at(0).memory_bytes; }

  Harness h_;
  uint64_t id_ = 0;
};

TEST_F(SymmetricRoundsTest, EveryRankGetsAHandleToEveryRanksBuffer) {
  const uint64_t before = MemoryBytes();
  Asking a0 = h_.Allocate(Rank(0), id_, 4096);
  EXPECT_FALSE(a0.call->Await().has_value());  // waits for rank 1
  Asking a1 = h_.Allocate(Rank(1), id_, 4096);
  ASSERT_TRUE(a0.call->Await()->ok()) << *a0.call->Await();
  ASSERT_TRUE(a1.call->Await()->ok()) << *a1.call->Await();
  EXPECT_EQ(a0.response->allocation_id(), a1.response->allocation_id());
  EXPECT_EQ(a0.response->bytes(), 4096u);
  EXPECT_EQ(a0.response->buffers_size(), 2);
  EXPECT_EQ(a1.response->buffers_size(), 2);
  EXPECT_GT(a0.response->data_offset(), 0u);
  EXPECT_GE(MemoryBytes(), before + 2 * 4096);

  v1::ReleaseSymmetricRequest release;
  release.set_group_id(id_);
  release.set_allocation_id(a0.response->allocation_id());
  ASSERT_TRUE(h_.groups().ReleaseSymmetric(*Rank(0), release).ok());
  EXPECT_GT(MemoryBytes(), before);  // rank 1 still holds it
  ASSERT_TRUE(h_.groups().ReleaseSymmetric(*Rank(1), release).ok());
  EXPECT_EQ(MemoryBytes(), before);
  EXPECT_EQ(h_.groups().ReleaseSymmetric(*Rank(1), release).code(), absl::StatusCode::kNotFound);
}

TEST_F(SymmetricRoundsTest, SizesThatDifferFailTheRoundListingEachRanksSize) {
  Asking a0 = h_.Allocate(Rank(0), id_, 4096);
  Asking a1 = h_.Allocate(Rank(1), id_, 8192);
  for (Asking* a : {&a0, &a1}) {
    const auto status = a->call->Await();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(status->message(), "(rank 0: 4096, rank 1: 8192)")) << *status;
  }
  // The next round is a fresh one.
  Asking b0 = h_.Allocate(Rank(0), id_, 64);
  Asking b1 = h_.Allocate(Rank(1), id_, 64);
  EXPECT_TRUE(b0.call->Await()->ok());
  EXPECT_TRUE(b1.call->Await()->ok());
}

// host_memory (a spanning CUDA group's agreement words) must be asked by every rank alike: a
// rank that asks the group's device while another asks host memory fails the round on both.
TEST_F(SymmetricRoundsTest, HostMemoryThatDiffersFailsTheRoundNamingEachRanksAsk) {
  Asking a0 = h_.Allocate(Rank(0), id_, 1024, 0, /*host_memory=*/true);
  Asking a1 = h_.Allocate(Rank(1), id_, 1024, 0, /*host_memory=*/false);
  for (Asking* a : {&a0, &a1}) {
    const auto status = a->call->Await();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(status->message(),
                                  "AllocateSymmetric memory differs across group g (rank 0: host, "
                                  "rank 1: the group's device); every rank must ask the same "
                                  "(host_memory)"))
        << *status;
  }
  Asking b0 = h_.Allocate(Rank(0), id_, 1024, 0, true);
  Asking b1 = h_.Allocate(Rank(1), id_, 1024, 0, true);
  ASSERT_TRUE(b0.call->Await()->ok()) << *b0.call->Await();
  ASSERT_TRUE(b1.call->Await()->ok()) << *b1.call->Await();
  EXPECT_EQ(b0.response->buffers(1).device(), "host");
}

TEST_F(SymmetricRoundsTest, ARoundTimesOutNamingTheRanksThatNeverAsked) {
  Asking a0 = h_.Allocate(Rank(0), id_, 4096, /*timeout_ms=*/50);
  const auto status = a0.call->Await(kWait);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(status->message(),
                                "rank(s) [1] never called AllocateSymmetric (allocation #0)"))
      << *status;
  // Rank 1's late ask joins the failed round and learns why at once.
  Asking late = h_.Allocate(Rank(1), id_, 4096);
  ASSERT_TRUE(late.call->Await().has_value());
  EXPECT_EQ(late.call->Await()->code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(SymmetricRoundsTest, ACancelledAskFailsTheRoundForTheOthers) {
  Asking a0 = h_.Allocate(Rank(0), id_, 4096);
  a0.call->Cancel();
  const auto status = a0.call->Await();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(status->message(), "rank 0 of group g cancelled")) << *status;
}

TEST_F(SymmetricRoundsTest, ARankLeavingFailsItsRoundAndEveryLaterOne) {
  Asking a0 = h_.Allocate(Rank(0), id_, 4096);
  h_.groups().OnSessionEnd(
      *Rank(1), {.reason = "process_exited", .exit = {.known = true, .wait_status = SIGKILL}});
  const auto status = a0.call->Await();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(status->message(), "rank 1 (pid")) << *status;
  Asking next = h_.Allocate(Rank(0), id_, 4096);
  ASSERT_TRUE(next.call->Await().has_value());
  EXPECT_EQ(next.call->Await()->code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(next.call->Await()->message(), "has left"));
}

TEST_F(SymmetricRoundsTest, AnAbortEndsAPendingRoundAndEveryLaterOne) {
  Asking a0 = h_.Allocate(Rank(0), id_, 4096);  // rank 1 never asks
  EXPECT_FALSE(a0.call->Await().has_value());
  h_.groups().Abort(id_, "on request: uid 0 says: stop");
  const auto status = a0.call->Await(kWait);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(status->message(), "group g aborted on request: uid 0 says: stop"))
      << *status;
  Asking next = h_.Allocate(Rank(1), id_, 4096);
  ASSERT_TRUE(next.call->Await().has_value());
  EXPECT_EQ(next.call->Await()->code(), absl::StatusCode::kAborted);
  h_.groups().Abort(id_, "again");  // a second abort changes nothing
  Asking last = h_.Allocate(Rank(0), id_, 64);
  ASSERT_TRUE(last.call->Await().has_value());
  EXPECT_TRUE(absl::StrContains(last.call->Await()->message(), "on request: uid 0 says: stop"));
}

TEST_F(SymmetricRoundsTest, OnlyAMemberMayAsk) {
  Asking a = h_.Allocate(h_.Session("stranger"), id_, 4096);
  ASSERT_TRUE(a.call->Await().has_value());
  EXPECT_EQ(a.call->Await()->code(), absl::StatusCode::kNotFound);
  Asking zero = h_.Allocate(Rank(0), id_, 0);
  ASSERT_TRUE(zero.call->Await().has_value());
  EXPECT_EQ(zero.call->Await()->code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace commd::groups
