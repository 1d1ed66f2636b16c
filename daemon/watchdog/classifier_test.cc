#include "daemon/watchdog/classifier.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::watchdog {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr uint64_t kMs = 1000000;
constexpr Thresholds kThresholds{.timeout_ns = 1000 * kMs, .heartbeat_timeout_ns = 500 * kMs};

EntryView AllReduce(int64_t n, RecordState state = RecordState::kStarted) {
  return {CollectiveOp::kAllReduce, {{n}}, {DataType::kFloat32}, state};
}

// A fake clock and a group of `world` ranks that all completed seq `done`.
class ClassifierTest : public ::testing::Test {
 protected:
  void MakeGroup(int world, uint64_t done) {
    view_.job_id = "job";
    view_.group = "g";
    view_.ranks.clear();
    for (int r = 0; r < world; ++r) {
      RankView v;
      v.rank = r;
      v.global_rank = r;
      v.pid = 100 + r;
      v.enqueued = v.started = v.completed = done;
      v.heartbeat_ns = 1;
      view_.ranks.push_back(v);
    }
  }
  // Rank `r` enters (and starts) seq `seq` with `e`.
  void Enter(int r, uint64_t seq, EntryView e = AllReduce(1024)) {
    RankView& v = view_.ranks[r];
    v.enqueued = seq;
    if (e.state != RecordState::kScheduled) v.started = seq;
    if (e.state == RecordState::kCompleted) v.completed = seq;
    v.entries[seq] = e;
    v.heartbeat_ns = now_;
  }
  std::optional<v1::Diagnosis> Poll() {
    GroupView copy = view_;
    tracker_.Observe(&copy, now_);
    last_ = copy;
    return Classify(copy, kThresholds, now_);
  }
  void Advance(uint64_t ns) { now_ += ns; }

  GroupView view_;
  GroupView last_;
  GroupTracker tracker_;
  uint64_t now_ = 1'000'000 * kMs;
};

TEST_F(ClassifierTest, HealthyGroupHasNoFinding) {
  MakeGroup(4, 10);
  EXPECT_FALSE(Poll().has_value());
  for (int r = 0; r < 4; ++r) Enter(r, 11);
  EXPECT_FALSE(Poll().has_value());
  Advance(900 * kMs);
  EXPECT_FALSE(Poll().has_value());
}

TEST_F(ClassifierTest, LongComputeGapWithNothingPendingIsNoFinding) {
  MakeGroup(4, 10);
  for (int i = 0; i < 100; ++i) {
    Advance(kThresholds.timeout_ns);  // a gap of many timeouts, heartbeats stale
    EXPECT_FALSE(Poll().has_value()) << "after " << i + 1 << " timeouts";
  }
}

TEST_F(ClassifierTest, LaggingNamesTheRanksBehind) {
  MakeGroup(4, 41);
  EXPECT_FALSE(Poll().has_value());
  for (int r : {0, 1, 3}) Enter(r, 42);  // rank 2 sleeps before seq 42
  EXPECT_FALSE(Poll().has_value());
  Advance(999 * kMs);
  EXPECT_FALSE(Poll().has_value()) << "not before the timeout";
  Advance(2 * kMs);
  auto d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::LAGGING);
  EXPECT_EQ(d->seq(), 42u);
  EXPECT_THAT(d->ranks_behind(), ElementsAre(2));
  EXPECT_THAT(d->ranks_ahead(), ElementsAre(0, 1, 3));
  EXPECT_EQ(d->ranks(0).op(), "all_reduce");
  EXPECT_EQ(d->ranks(2).op(), "");
  EXPECT_EQ(d->since_unix_ms(), static_cast<int64_t>((now_ - 1001 * kMs) / kMs));
}

TEST_F(ClassifierTest, LaggingWhenTheLeadersMovedOn) {
  MakeGroup(4, 41);
  Poll();
  for (int r : {0, 1, 2}) Enter(r, 42, AllReduce(8, RecordState::kCompleted));
  for (int r : {0, 1, 2}) Enter(r, 43);
  Poll();
  Advance(1001 * kMs);
  auto d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::LAGGING);
  EXPECT_EQ(d->seq(), 42u);
  EXPECT_THAT(d->ranks_behind(), ElementsAre(3));
}

TEST_F(ClassifierTest, StuckNamesTheRanksThatDidNotFinish) {
  MakeGroup(4, 6);
  Poll();
  for (int r = 0; r < 4; ++r) Enter(r, 7);
  for (int r : {0, 2, 3}) view_.ranks[r].completed = 7;
  Poll();
  Advance(1001 * kMs);
  auto d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::STUCK);
  EXPECT_EQ(d->seq(), 7u);
  EXPECT_THAT(d->ranks_behind(), ElementsAre(1));
  EXPECT_THAT(d->ranks_ahead(), ElementsAre(0, 2, 3));
}

TEST_F(ClassifierTest, StuckWithNothingFinishedNamesEveryRank) {
  MakeGroup(2, 0);
  Poll();
  Enter(0, 1);
  Enter(1, 1);
  Advance(2000 * kMs);
  auto d = Poll();  // pending since this poll: not yet
  EXPECT_FALSE(d.has_value());
  Advance(1001 * kMs);
  d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::STUCK);
  EXPECT_THAT(d->ranks_behind(), ElementsAre(0, 1));
  EXPECT_THAT(d->ranks_ahead(), IsEmpty());
}

TEST_F(ClassifierTest, MismatchOnOpSizeOrDtype) {
  struct Case {
    EntryView odd;
  };
  const std::vector<EntryView> odds = {
      {CollectiveOp::kAllGather, {{1024}}, {DataType::kFloat32}, RecordState::kStarted},
      AllReduce(2048),
      {CollectiveOp::kAllReduce, {{1024}}, {DataType::kBFloat16}, RecordState::kStarted}};
  for (const EntryView& odd : odds) {
    MakeGroup(4, 4);
    tracker_ = GroupTracker();
    Poll();
    for (int r : {0, 1, 2}) Enter(r, 5);
    Enter(3, 5, odd);
    auto d = Poll();  // no timeout needed: disagreement is certain at once
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->kind(), v1::MISMATCH);
    EXPECT_EQ(d->seq(), 5u);
    EXPECT_THAT(d->ranks_behind(), ElementsAre(3));
    EXPECT_THAT(d->ranks_ahead(), ElementsAre(0, 1, 2));
    ASSERT_EQ(d->ranks_size(), 4);
    EXPECT_EQ(d->ranks(0).input_sizes(0), "[1024]");
    EXPECT_EQ(d->ranks(0).input_dtypes(0), "Float");
  }
}

TEST_F(ClassifierTest, DeadRankThatOthersWaitFor) {
  MakeGroup(4, 3);
  Poll();
  view_.ranks[1].liveness = Liveness::kDead;
  EXPECT_FALSE(Poll().has_value()) << "nobody waits for it yet";
  for (int r : {0, 2, 3}) Enter(r, 4);
  auto d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::DEAD);
  EXPECT_EQ(d->seq(), 4u);
  EXPECT_THAT(d->ranks_dead(), ElementsAre(1));
  EXPECT_THAT(d->ranks_behind(), ElementsAre(1));
  EXPECT_THAT(d->ranks_ahead(), ElementsAre(0, 2, 3));
  EXPECT_EQ(d->ranks(1).liveness(), "dead");
}

TEST_F(ClassifierTest, DeadWhileHoldingWork) {
  MakeGroup(2, 3);
  Enter(0, 4);
  view_.ranks[0].liveness = Liveness::kDead;
  auto d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::DEAD);
  EXPECT_THAT(d->ranks_dead(), ElementsAre(0));
}

TEST_F(ClassifierTest, CleanExitWhileOthersWaitIsDead) {
  MakeGroup(3, 9);
  view_.ranks[2].liveness = Liveness::kLeft;
  EXPECT_FALSE(Poll().has_value());
  Enter(0, 10);
  auto d = Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind(), v1::DEAD);
  EXPECT_THAT(d->ranks_dead(), ElementsAre(2));
  EXPECT_EQ(d->ranks(2).liveness(), "left");
}

// A death is a finding even with nothing pending: the dead rank can join no later collective.
TEST_F(ClassifierTest, DeathIsAFindingWhateverTheOthersDo) {
  MakeGroup(3, 9);
  Enter(0, 10);
  view_.ranks[1].liveness = Liveness::kDead;
  const v1::Diagnosis d =
      DeathDiagnosis(view_, 1, "group g: rank 1 (pid 101) exited: killed by SIGKILL", now_);
  EXPECT_EQ(d.kind(), v1::DEAD);
  EXPECT_EQ(d.seq(), 10u);
  EXPECT_THAT(d.ranks_dead(), ElementsAre(1));
  EXPECT_THAT(d.ranks_behind(), ElementsAre(1));
  EXPECT_THAT(d.ranks_ahead(), ElementsAre(0));
  EXPECT_EQ(d.ranks(1).liveness(), "dead");
  EXPECT_EQ(d.summary(), "group g: rank 1 (pid 101) exited: killed by SIGKILL");
}

TEST_F(ClassifierTest, EveryRankLeavingAfterTheLastCollectiveIsNoFinding) {
  MakeGroup(3, 9);
  view_.ranks[0].liveness = Liveness::kLeft;
  view_.ranks[1].liveness = Liveness::kDead;
  EXPECT_FALSE(Poll().has_value());
}

TEST_F(ClassifierTest, UnresponsiveRankHoldingWorkWhilePeersHeartbeat) {
  MakeGroup(4, 0);
  Poll();
  for (int r = 0; r < 4; ++r) Enter(r, 1);
  Poll();
  for (int i = 0; i < 6; ++i) {
    Advance(100 * kMs);
    for (int r : {0, 1, 2}) view_.ranks[r].heartbeat_ns = now_;  // waiting, alive
    auto d = Poll();
    if (i < 5) {
      EXPECT_FALSE(d.has_value()) << i;
      continue;
    }
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->kind(), v1::UNRESPONSIVE);
    EXPECT_THAT(d->ranks_behind(), ElementsAre(3));
    EXPECT_GE(d->ranks(3).heartbeat_age_ms(), 500);
  }
}

TEST_F(ClassifierTest, EveryRankSilentIsNotUnresponsive) {
  // A long kernel on every rank: nobody heartbeats, nobody is singled out before the timeout.
  MakeGroup(4, 0);
  Poll();
  for (int r = 0; r < 4; ++r) Enter(r, 1);
  Poll();
  Advance(900 * kMs);
  EXPECT_FALSE(Poll().has_value());
}

TEST_F(ClassifierTest, SuspectPastHalfTheTimeout) {
  MakeGroup(2, 0);
  Poll();
  Enter(0, 1);
  Poll();
  EXPECT_FALSE(IsSuspect(last_, kThresholds, now_));
  Advance(600 * kMs);
  Poll();
  EXPECT_TRUE(IsSuspect(last_, kThresholds, now_));
}

TEST_F(ClassifierTest, RendezvousNamesTheMissingRanks) {
  v1::Diagnosis d = RendezvousDiagnosis("job", 7, "g", {0, 2}, {1, 3}, 5 * kMs, 9 * kMs);
  EXPECT_EQ(d.kind(), v1::RENDEZVOUS);
  EXPECT_THAT(d.ranks_behind(), ElementsAre(1, 3));
  EXPECT_THAT(d.ranks_ahead(), ElementsAre(0, 2));
  EXPECT_EQ(d.since_unix_ms(), 5);
}

}  // namespace
}  // namespace commd::watchdog
