// The registry's side of groups that span nodes (rendezvous.cc), over a fake of the
// SpanRendezvous seam (the cluster's etcd backend has its own tests against a real etcd:
// tests/integration/span_test.cc): what the local ranks must agree on, when they are
// answered, and that this node's part is withdrawn whenever the group fails or its last local
// rank leaves.
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "daemon/groups/group_registry.h"
#include "daemon/groups/group_test_util.h"
#include "daemon/groups/span_rendezvous.h"
#include "gtest/gtest.h"

namespace commd::groups {
namespace {

using testing::Harness;
using testing::Joining;

constexpr absl::Duration kWait = absl::Seconds(20);  // a bound, not a timing: timers run late

// Records the parts it is given; the test answers them.
class FakeSpan : public SpanRendezvous {
 public:
  struct Wait : SpanWait {
    std::string Missing() const override { return "global rank(s) [2] never joined (fake)"; }
    void Withdraw() override {
      absl::MutexLock lock(&mu);
      ++withdrawn;
    }
    int withdrawals() {
      absl::MutexLock lock(&mu);
      return withdrawn;
    }
    absl::Mutex mu;
    int withdrawn ABSL_GUARDED_BY(mu) = 0;
    SpanPart part;
    std::function<void(absl::StatusOr<v1::GroupLayout>)> done;
  };
  absl::Status Admit() const override { return admit; }
  absl::StatusOr<std::shared_ptr<SpanWait>> Start(
      SpanPart part, std::function<void(absl::StatusOr<v1::GroupLayout>)> done) override {
    auto w = std::make_shared<Wait>();
    w->part = std::move(part);
    w->done = std::move(done);
    waits.push_back(w);
    return w;
  }
  void Shutdown() override {}

  absl::Status admit;
  std::vector<std::shared_ptr<Wait>> waits;  // the registry starts them under its lock only
};

v1::JoinGroupRequest Request(int rank, int world, int global_rank, int global_world,
                             int64_t timeout_ms = 0) {
  v1::JoinGroupRequest r;
  r.set_name("g");
  r.set_rank(rank);
  r.set_world_size(world);
  r.set_global_rank(global_rank);
  r.set_global_world_size(global_world);
  r.set_timeout_ms(timeout_ms);
  return r;
}

class SpanningRendezvousTest : public ::testing::Test {
 protected:
  SpanningRendezvousTest() { h_.groups().set_span_rendezvous(&span_); }
  Joining Join(const std::string& token, const v1::JoinGroupRequest& r) {
    Joining j;
    h_.groups().Join(h_.Session(token), r, j.response.get(), j.call);
    return j;
  }
  v1::GroupLayout Layout() {
    v1::GroupLayout layout;
    auto* a = layout.add_nodes();
    a->set_node("node-a");
    a->add_global_ranks(3);
    a->add_global_ranks(1);
    auto* b = layout.add_nodes();
    b->set_node("node-b");
    b->add_global_ranks(0);
    b->add_global_ranks(2);
    return layout;
  }

  FakeSpan span_;
  Harness h_;
};

TEST_F(SpanningRendezvousTest, LocalRanksAreAnsweredWithTheLayoutOnlyOnceTheNodesAre) {
  Joining j0 = Join("t0", Request(0, 2, 3, 4));
  Joining j1 = Join("t1", Request(1, 2, 1, 4));
  ASSERT_EQ(span_.waits.size(), 1u);
  const SpanPart& part = span_.waits[0]->part;
  EXPECT_EQ(part.uid, 1001u);
  EXPECT_EQ(part.job, "job");
  EXPECT_EQ(part.group, "g");
  EXPECT_EQ(part.global_world_size, 4);
  EXPECT_EQ(part.global_ranks, (std::vector<int>{3, 1}));  // by local rank
  EXPECT_FALSE(j0.call->Await(absl::Milliseconds(100)).has_value());
  EXPECT_FALSE(h_.groups().Snapshot()->groups[0].active);

  span_.waits[0]->done(Layout());
  ASSERT_TRUE(j0.call->Await(kWait).value_or(absl::UnknownError("unfinished")).ok());
  ASSERT_TRUE(j1.call->Await(kWait).value_or(absl::UnknownError("unfinished")).ok());
  for (Joining* j : {&j0, &j1}) {
    EXPECT_EQ(j->response->global_world_size(), 4);
    EXPECT_EQ(j->response->layout().SerializeAsString(), Layout().SerializeAsString());
  }
  EXPECT_EQ(j1.response->members(1).global_rank(), 1);
  EXPECT_EQ(span_.waits[0]->withdrawals(), 0);  // formed: the part stays while ranks are in
  // The last local rank leaving takes this node's part out.
  h_.groups().OnSessionEnd(*h_.Session("t0"), {.reason = "closed"});
  EXPECT_EQ(span_.waits[0]->withdrawals(), 0);
  h_.groups().OnSessionEnd(*h_.Session("t1"), {.reason = "closed"});
  EXPECT_EQ(span_.waits[0]->withdrawals(), 1);
}

TEST_F(SpanningRendezvousTest, LocalRanksMustAgreeBeforeAnythingIsPublished) {
  Joining j0 = Join("t0", Request(0, 3, 0, 6));
  Joining other_size = Join("t1", Request(1, 3, 1, 8));
  EXPECT_EQ(other_size.call->Await()->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other_size.call->Await()->message(),
            "global world size 8 disagrees with group g's global world size 6 (set by the first "
            "rank to join; 0 for a group on this node only)");
  Joining same_global = Join("t2", Request(2, 3, 0, 6));
  EXPECT_EQ(same_global.call->Await()->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(same_global.call->Await()->message(),
                                "rank 2 claims global rank 0 of group g, which rank 0 (pid"))
      << *same_global.call->Await();
  EXPECT_TRUE(span_.waits.empty());
}

TEST_F(SpanningRendezvousTest, AFailureFromTheNodesFailsEveryLocalRankAndWithdraws) {
  Joining j0 = Join("t0", Request(0, 2, 0, 4));
  Joining j1 = Join("t1", Request(1, 2, 1, 4));
  ASSERT_EQ(span_.waits.size(), 1u);
  span_.waits[0]->done(absl::FailedPreconditionError("nodes disagree"));
  for (Joining* j : {&j0, &j1}) {
    EXPECT_EQ(j->call->Await(kWait)->code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(span_.waits[0]->withdrawals(), 1);
  EXPECT_EQ(h_.groups().size(), 0u);
}

TEST_F(SpanningRendezvousTest, TheDeadlineNamesWhatTheNodesLackAndWithdraws) {
  Joining j0 = Join("t0", Request(0, 1, 0, 3, /*timeout_ms=*/200));
  ASSERT_EQ(span_.waits.size(), 1u);
  const std::optional<absl::Status> s = j0.call->Await(kWait);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s->message(),
            "group g spans nodes and did not form within 200ms: global rank(s) [2] never joined "
            "(fake) (global world size 3)");
  EXPECT_EQ(span_.waits[0]->withdrawals(), 1);
  EXPECT_EQ(h_.groups().size(), 0u);
  // An answer after the deadline finds nobody to answer.
  span_.waits[0]->done(Layout());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(j0.call->finishes(), 1);
}

TEST_F(SpanningRendezvousTest, ADisconnectedClusterRefusesTheJoin) {
  span_.admit = absl::UnavailableError("the cluster is disconnected (etcd at 127.0.0.1:1)");
  Joining j0 = Join("t0", Request(0, 1, 0, 2));
  EXPECT_EQ(*j0.call->Await(), span_.admit);
  EXPECT_EQ(h_.groups().size(), 0u);
}

TEST(SpanningRendezvousWithoutClusterTest, IsRefusedNamingTheMissingCluster) {
  Harness h;
  Joining j;
  h.groups().Join(h.Session("t0"), Request(0, 2, 0, 4), j.response.get(), j.call);
  EXPECT_EQ(j.call->Await()->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(j.call->Await()->message(), "which needs a cluster"));
  EXPECT_EQ(h.groups().size(), 0u);
}

}  // namespace
}  // namespace commd::groups
