// The rendezvous of GroupRegistry (rendezvous.cc), driven through fake pending calls.
#include <signal.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/groups/group_registry.h"
#include "daemon/groups/group_test_util.h"
#include "gtest/gtest.h"

namespace commd::groups {
namespace {

using testing::Harness;
using testing::Joining;

constexpr absl::Duration kWait = absl::Seconds(20);  // a bound, not a timing: timers run late

server::SessionEnd Closed() { return {.reason = "closed"}; }
server::SessionEnd Killed() {
  return {.reason = "process_exited", .exit = {.known = true, .wait_status = SIGKILL}};
}

TEST(RendezvousTest, FormsWhenTheLastRankJoinsAndAnswersEveryRank) {
  Harness h;
  auto s0 = h.Session("t0"), s1 = h.Session("t1");
  Joining j1 = h.Join(s1, "g", 2, 1);
  EXPECT_FALSE(j1.call->Await().has_value());  // waits for rank 0
  const auto forming = h.groups().Snapshot();
  ASSERT_EQ(forming->groups.size(), 1u);
  EXPECT_FALSE(forming->groups[0].active);
  EXPECT_EQ(forming->groups[0].joined, 1);

  Joining j0 = h.Join(s0, "g", 2, 0);
  ASSERT_TRUE(j0.call->Await()->ok()) << *j0.call->Await();
  ASSERT_TRUE(j1.call->Await()->ok()) << *j1.call->Await();
  EXPECT_EQ(j0.response->group_id(), j1.response->group_id());
  EXPECT_EQ(j0.response->rank(), 0);
  EXPECT_EQ(j1.response->rank(), 1);
  EXPECT_EQ(j1.response->world_size(), 2);
  ASSERT_EQ(j1.response->members_size(), 2);
  EXPECT_EQ(j1.response->members(0).pid(), getpid());
  EXPECT_EQ(j1.response->members(1).device(), "host");
  EXPECT_FALSE(j0.response->control_block().import_token().empty());

  // A published snapshot never changes: the one taken during the rendezvous still says so.
  EXPECT_FALSE(forming->groups[0].active);
  const auto formed = h.groups().Snapshot();
  ASSERT_EQ(formed->groups.size(), 1u);
  const GroupSnapshot& g = formed->groups[0];
  EXPECT_TRUE(g.active);
  EXPECT_EQ(g.uid, 1001u);
  EXPECT_EQ(g.job_id, "job");
  EXPECT_EQ(g.name, "g");
  ASSERT_EQ(g.members.size(), 2u);
  EXPECT_NE(g.members[0].block, nullptr);
  EXPECT_NE(g.members[1].block, nullptr);
  EXPECT_EQ(g.members[1].session_token, "t1");
  EXPECT_GT(g.memory_bytes, 0u);
}

TEST(RendezvousTest, RejectsARankOutsideTheWorldNamingTheRange) {
  Harness h;
  Joining j = h.Join(h.Session("t0"), "g", 2, 2);
  const auto status = j.call->Await();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status->message(), "rank 2 for group g of world size 2; allowed 0 to 1");
  EXPECT_TRUE(h.groups().Snapshot()->groups.empty());
}

TEST(RendezvousTest, ASecondJoinOfTheSameRankIsRefused) {
  Harness h;
  Joining first = h.Join(h.Session("t0"), "g", 2, 0);
  Joining again = h.Join(h.Session("t1"), "g", 2, 0);
  ASSERT_TRUE(again.call->Await().has_value());
  EXPECT_EQ(again.call->Await()->code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(first.call->Await().has_value());
}

TEST(RendezvousTest, DeadlineFailsTheWaitingRanksNamingTheMissing) {
  Harness h;
  Joining j0 = h.Join(h.Session("t0"), "g", 3, 0, /*timeout_ms=*/50);
  Joining j2 = h.Join(h.Session("t2"), "g", 3, 2, /*timeout_ms=*/50);
  for (Joining* j : {&j0, &j2}) {
    const auto status = j->call->Await(kWait);
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(absl::StrContains(status->message(), "rank(s) [1] never joined")) << *status;
    EXPECT_TRUE(absl::StrContains(status->message(), "joined: [0, 2]")) << *status;
  }
  const auto timeouts = h.timeouts();
  ASSERT_EQ(timeouts.size(), 1u);
  EXPECT_EQ(timeouts[0].group, "g");
  EXPECT_EQ(timeouts[0].joined, (std::vector<int>{0, 2}));
  EXPECT_EQ(timeouts[0].missing, (std::vector<int>{1}));
  EXPECT_TRUE(h.groups().Snapshot()->groups.empty());
  EXPECT_EQ(h.groups().size(), 0u);
}

TEST(RendezvousTest, ASessionEndingDuringTheRendezvousFailsTheOthers) {
  Harness h;
  auto s0 = h.Session("t0");
  Joining j0 = h.Join(s0, "g", 3, 0);
  Joining j1 = h.Join(h.Session("t1"), "g", 3, 1);
  h.groups().OnSessionEnd(*s0, Closed());
  const auto status = j1.call->Await();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(status->message(), "closed its session during the rendezvous"))
      << *status;
  EXPECT_EQ(j1.call->finishes(), 1);
  // The name is free at once.
  Joining again = h.Join(h.Session("t3"), "g", 1, 0);
  EXPECT_TRUE(again.call->Await()->ok());
}

TEST(RendezvousTest, AJoinTheClientDroppedFailsTheOthersAfterTheSettleTime) {
  Harness h;
  Joining j0 = h.Join(h.Session("t0"), "g", 3, 0);
  Joining j1 = h.Join(h.Session("t1"), "g", 3, 1);
  j0.call->Cancel();
  const auto status = j1.call->Await(kWait);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(status->message(), "abandoned its join")) << *status;
}

TEST(RendezvousTest, ARankDyingInAFormedGroupReportsTheGroupAsItWas) {
  Harness h;
  auto s0 = h.Session("t0"), s1 = h.Session("t1");
  Joining j0 = h.Join(s0, "g", 2, 0);
  Joining j1 = h.Join(s1, "g", 2, 1);
  ASSERT_TRUE(j1.call->Await()->ok());
  h.groups().OnSessionEnd(*s1, Killed());
  auto deaths = h.deaths();
  ASSERT_EQ(deaths.size(), 1u);
  EXPECT_EQ(deaths[0].rank, 1);
  EXPECT_EQ(deaths[0].text, absl::StrCat("rank 1 (pid ", getpid(), ") exited: killed by SIGKILL"));
  ASSERT_EQ(deaths[0].group.members.size(), 2u);
  EXPECT_TRUE(deaths[0].group.members[1].died);
  EXPECT_NE(deaths[0].group.members[1].block, nullptr);  // still mapped for the dump
  // The last rank leaving retires the group; the death's copy keeps its blocks.
  h.groups().OnSessionEnd(*s0, Closed());
  EXPECT_TRUE(h.groups().Snapshot()->groups.empty());
  EXPECT_EQ(h.deaths().size(), 1u);  // a clean close is no death
}

TEST(RendezvousTest, TheDescriptionIsStoredListedAndAnsweredDefaultingToTorchs) {
  Harness h;
  Joining j0 = h.Join(h.Session("t0"), "g", 2, 0, 0, "default_pg");
  Joining j1 = h.Join(h.Session("t1"), "g", 2, 1, 0, "default_pg");
  ASSERT_TRUE(j1.call->Await()->ok()) << *j1.call->Await();
  EXPECT_EQ(j0.response->description(), "default_pg");
  EXPECT_EQ(j1.response->description(), "default_pg");
  EXPECT_EQ(h.groups().Snapshot()->groups[0].description, "default_pg");

  Joining plain = h.Join(h.Session("t2"), "h", 1, 0);
  ASSERT_TRUE(plain.call->Await()->ok()) << *plain.call->Await();
  EXPECT_EQ(plain.response->description(), "undefined");  // PyTorch's word for none
}

TEST(RendezvousTest, ADescriptionOverTheLimitIsRefusedQuotingABoundedPrefix) {
  Harness h;
  const std::string longest(kMaxGroupDescriptionBytes, 'd');
  Joining ok = h.Join(h.Session("t0"), "g", 1, 0, 0, longest);
  ASSERT_TRUE(ok.call->Await()->ok()) << *ok.call->Await();
  EXPECT_EQ(ok.response->description(), longest);

  const std::string hostile(1 << 20, 'x');  // 1 MiB: never stored, never echoed whole
  Joining j = h.Join(h.Session("t1"), "big", 1, 0, 0, hostile);
  const auto status = j.call->Await();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status->message(), absl::StrCat("group description \"", std::string(64, 'x'),
                                            "…\" (1048576 bytes) is longer than 63 bytes (the "
                                            "flight recorder's process-group desc); allowed 0 to "
                                            "63 bytes of printable ASCII"));
  Joining nul = h.Join(h.Session("t2"), "nul", 1, 0, 0, std::string("a\0b", 3));
  ASSERT_TRUE(nul.call->Await().has_value());
  EXPECT_EQ(nul.call->Await()->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nul.call->Await()->message(),
            "group description \"a\\000b\" has the byte '\\000' at 1; allowed printable ASCII");
  ASSERT_EQ(h.groups().Snapshot()->groups.size(), 1u);  // only "g": the refused made none
}

TEST(RendezvousTest, RanksThatDisagreeOnTheDescriptionAreRefusedNamingBoth) {
  Harness h;
  Joining j0 = h.Join(h.Session("t0"), "g", 2, 0, 0, "default_pg");
  Joining j1 = h.Join(h.Session("t1"), "g", 2, 1, 0, "other");
  const auto status = j1.call->Await();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status->message(),
            "rank 1 gives group g the description \"other\" but the group's is \"default_pg\" "
            "(set by the first rank to join); every rank must give the same");
  EXPECT_FALSE(j0.call->Await().has_value());  // rank 0 still waits for a rank 1 that agrees
  Joining again = h.Join(h.Session("t2"), "g", 2, 1, 0, "default_pg");
  ASSERT_TRUE(again.call->Await()->ok()) << *again.call->Await();
  ASSERT_TRUE(j0.call->Await()->ok());
}

}  // namespace
}  // namespace commd::groups
