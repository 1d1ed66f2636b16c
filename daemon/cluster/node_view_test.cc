// The view of the cluster's nodes without etcd: what the watch's events and the reads make of
// it, in revision order, its bounds against what a hostile writer of etcd may put under
// <prefix>/nodes/, and the pages ListClusterNodes answers. What needs etcd is in
// tests/integration/cluster_test.cc.
#include "daemon/cluster/node_view.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::cluster {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

std::string Value(const std::string& owner, int64_t ttl) {
  return absl::StrCat(R"({"owner":")", owner, R"(","pid":42,"version":"0.1.0",)",
                      R"("metrics":"127.0.0.1:9464","lease_ttl_s":)", ttl, "}");
}

v1::ListClusterNodesResponse ListAll(NodeView& view, const LeaseState& self = {},
                                     absl::Time now = kT0) {
  auto r = view.List({}, self, now);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : v1::ListClusterNodesResponse{};
}

std::vector<std::string> Names(const v1::ListClusterNodesResponse& r) {
  std::vector<std::string> names;
  for (const auto& n : r.nodes()) names.push_back(absl::StrCat(n.name(), n.live() ? "" : "!"));
  return names;
}

TEST(NodeViewTest, ListsLiveNodesWithTheirValuesAndThisNodesLeaseLeft) {
  NodeView view({}, "node-a");
  ASSERT_TRUE(view.Put("node-b", Value("h2:/run/commd", 10), 0xb, 7, kT0));
  ASSERT_TRUE(view.Put("node-a", Value("h1:/run/commd", 10), 0xa, 5, kT0));
  view.SetWatching(true, kT0);
  const auto r = ListAll(view, {.id = 0xa, .ttl_seconds = 10, .remaining_seconds = 7.5},
                         kT0 + absl::Seconds(1));
  EXPECT_THAT(Names(r), ::testing::ElementsAre("node-a", "node-b"));
  EXPECT_EQ(r.live_nodes(), 2u);
  EXPECT_EQ(r.gone_nodes(), 0u);
  EXPECT_FALSE(r.truncated());
  EXPECT_TRUE(r.watching());
  EXPECT_EQ(r.revision(), 7);
  const v1::ClusterNode& a = r.nodes(0);
  EXPECT_TRUE(a.this_node());
  EXPECT_EQ(a.lease_id(), 0xa);
  EXPECT_EQ(a.lease_ttl_seconds(), 10);
  EXPECT_EQ(a.lease_remaining_seconds(), 7.5);
  const v1::ClusterNode& b = r.nodes(1);
  EXPECT_FALSE(b.this_node());
  EXPECT_EQ(b.lease_remaining_seconds(), -1);  // not known: etcd is not asked per node
  EXPECT_EQ(b.lease_ttl_seconds(), 10);
  EXPECT_EQ(b.owner(), "h2:/run/commd");
  EXPECT_EQ(b.pid(), 42);
  EXPECT_EQ(b.version(), "0.1.0");
  EXPECT_EQ(b.metrics_address(), "127.0.0.1:9464");
  EXPECT_EQ(b.since_unix_ms(), absl::ToUnixMillis(kT0));
  EXPECT_EQ(b.revision(), 7);
  // This node's remaining time is its own lease's only: a stale lease id is not it.
  const auto other = ListAll(view, {.id = 0xdead, .ttl_seconds = 10, .remaining_seconds = 7.5});
  EXPECT_EQ(other.nodes(0).lease_remaining_seconds(), -1);
}

TEST(NodeViewTest, AGoneNodeIsListedAsSuchAndChangesApplyInRevisionOrder) {
  NodeView view({}, "node-a");
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xb, 7, kT0));
  EXPECT_TRUE(view.Delete("node-b", 9, kT0 + absl::Seconds(3)));
  EXPECT_FALSE(view.Delete("node-b", 9, kT0 + absl::Seconds(4)));  // already gone
  // The write it replaced, arriving late (a read that crossed the watch's event): ignored.
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xb, 8, kT0 + absl::Seconds(5)));
  auto r = ListAll(view);
  EXPECT_THAT(Names(r), ::testing::ElementsAre("node-b!"));
  EXPECT_EQ(r.live_nodes(), 0u);
  EXPECT_EQ(r.gone_nodes(), 1u);
  EXPECT_EQ(r.nodes(0).since_unix_ms(), absl::ToUnixMillis(kT0 + absl::Seconds(3)));
  EXPECT_EQ(r.nodes(0).revision(), 9);
  // Registered again, on a new lease: live from then.
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xc, 10, kT0 + absl::Seconds(6)));
  r = ListAll(view);
  EXPECT_THAT(Names(r), ::testing::ElementsAre("node-b"));
  EXPECT_EQ(r.nodes(0).lease_id(), 0xc);
  EXPECT_EQ(r.nodes(0).since_unix_ms(), absl::ToUnixMillis(kT0 + absl::Seconds(6)));
  EXPECT_FALSE(view.Delete("node-b", 9, kT0));  // older than that registration
  EXPECT_EQ(view.live(), 1u);
}

TEST(NodeViewTest, AReadFindsTheDeletionsTheWatchMissedButNotPastItsLimit) {
  NodeView view({}, "node-a");
  ASSERT_TRUE(view.Put("node-a", Value("h1:/r", 2), 1, 3, kT0));
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 2, 4, kT0));
  ASSERT_TRUE(view.Put("node-c", Value("h3:/r", 2), 3, 5, kT0));
  // A read stopped at its limit says nothing of the keys it did not return.
  EXPECT_THAT(view.Reconcile({{"node-a", Value("h1:/r", 2), 1, 3}}, 20, /*complete=*/false, kT0),
              ::testing::IsEmpty());
  EXPECT_EQ(view.live(), 3u);
  EXPECT_TRUE(ListAll(view).incomplete());
  // A whole read: node-b went while the watch was down; node-d came; node-c's key written after
  // the read's revision stays.
  ASSERT_TRUE(view.Put("node-c", Value("h3:/r", 2), 3, 25, kT0));
  // The nodes whose registration ended are returned, for the groups spanning them.
  EXPECT_THAT(
      view.Reconcile({{"node-a", Value("h1:/r", 2), 1, 3}, {"node-d", Value("h4:/r", 2), 4, 18}},
                     21, /*complete=*/true, kT0 + absl::Seconds(1)),
      ::testing::ElementsAre("node-b"));
  const auto r = ListAll(view);
  EXPECT_THAT(Names(r), ::testing::ElementsAre("node-a", "node-b!", "node-c", "node-d"));
  EXPECT_FALSE(r.incomplete());
  EXPECT_EQ(r.revision(), 25);
}

// A daemon restarted within its lease's TTL takes its key over with a PUT on a new lease, with
// no deletion between: the earlier registration ended all the same (nothing watches the ranks
// it held), as a write on the same lease (a daemon rewriting its own key) does not.
TEST(NodeViewTest, AKeyTakenOverOnANewLeaseEndsTheEarlierRegistration) {
  NodeView view({}, "node-a");
  bool replaced = true;
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xb, 7, kT0, &replaced));
  EXPECT_FALSE(replaced);  // first seen
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 3), 0xb, 8, kT0, &replaced));
  EXPECT_FALSE(replaced);  // the same lease
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xc, 9, kT0 + absl::Seconds(1), &replaced));
  EXPECT_TRUE(replaced);
  EXPECT_EQ(view.live(), 1u);
  // A late event older than what the view holds changes nothing, and ends nothing.
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xb, 8, kT0, &replaced));
  EXPECT_FALSE(replaced);
  // After a deletion, a new lease is a new registration, not a takeover.
  EXPECT_TRUE(view.Delete("node-b", 10, kT0));
  ASSERT_TRUE(view.Put("node-b", Value("h2:/r", 2), 0xd, 11, kT0, &replaced));
  EXPECT_FALSE(replaced);
  // A read that finds the key on another lease than the view holds: ended, and still live.
  EXPECT_THAT(view.Reconcile({{"node-b", Value("h2:/r", 2), 0xe, 15}}, 15, /*complete=*/true, kT0),
              ::testing::ElementsAre("node-b"));
  EXPECT_EQ(ListAll(view).nodes(0).lease_id(), 0xe);
  EXPECT_EQ(view.live(), 1u);
}

// What a writer of etcd other than commd may put under <prefix>/nodes/: keys that name no node,
// values that are huge, not JSON, or of the wrong types, more nodes than the view keeps, and
// nodes that come and go. The view holds a bounded amount whatever it is fed.
TEST(NodeViewTest, WhatAHostileWriterOfEtcdPutsThereIsBounded) {
  NodeView view({.max_live = 3, .max_gone = 2, .gone_kept = absl::Minutes(10)}, "node-a");
  EXPECT_FALSE(view.Put("bad name", "{}", 1, 2, kT0));
  EXPECT_FALSE(view.Put(std::string(129, 'n'), "{}", 1, 3, kT0));
  EXPECT_FALSE(view.Put("", "{}", 1, 4, kT0));
  EXPECT_FALSE(view.Put("a/b", "{}", 1, 5, kT0));
  ASSERT_TRUE(view.Put("huge", std::string(1 << 20, '{'), 1, 6, kT0));
  ASSERT_TRUE(view.Put("junk", "not json", 1, 7, kT0));
  ASSERT_TRUE(view.Put("typed",
                       absl::StrCat(R"({"owner":7,"pid":"x","lease_ttl_s":-5,"version":")",
                                    std::string(300, 'v'), R"("})"),
                       1, 8, kT0));
  ASSERT_TRUE(view.Put("long", absl::StrCat(R"({"owner":")", std::string(3000, 'o'), R"("})"), 1, 9,
                       kT0));  // the fourth live node: not kept
  auto r = ListAll(view);
  EXPECT_THAT(Names(r), ::testing::ElementsAre("huge", "junk", "typed"));
  EXPECT_EQ(r.rejected_keys(), 4u);
  EXPECT_TRUE(r.incomplete());
  for (const auto& n : r.nodes()) {
    EXPECT_EQ(n.owner(), "") << n.name();
    EXPECT_EQ(n.pid(), 0) << n.name();
    EXPECT_EQ(n.lease_ttl_seconds(), 0) << n.name();
    EXPECT_LE(n.version().size(), NodeView::kMaxFieldBytes) << n.name();
  }
  // A kept string is cut.
  NodeView roomy({}, "node-a");
  ASSERT_TRUE(
      roomy.Put("long", absl::StrCat(R"({"owner":")", std::string(3000, 'o'), R"("})"), 1, 9, kT0));
  EXPECT_EQ(ListAll(roomy).nodes(0).owner().size(), NodeView::kMaxFieldBytes);

  // Gone nodes: at most max_gone, the oldest go first, none past gone_kept.
  for (int i = 0; i < 5; ++i) {
    (void)view.Delete(absl::StrCat("g", i), 20 + i, kT0 + absl::Seconds(i));
  }
  r = ListAll(view, {}, kT0 + absl::Seconds(5));
  EXPECT_THAT(Names(r), ::testing::ElementsAre("g3!", "g4!", "huge", "junk", "typed"));
  r = ListAll(view, {}, kT0 + absl::Minutes(11));
  EXPECT_THAT(Names(r), ::testing::ElementsAre("huge", "junk", "typed"));
}

TEST(NodeViewTest, AnswersArePagedAndBadRequestsNameTheirRange) {
  NodeView view({}, "n0000");
  for (int i = 0; i < 1005; ++i) {
    ASSERT_TRUE(view.Put(absl::StrFormat("n%04d", i), "{}", i + 1, i + 1, kT0));
  }
  auto first = view.List({}, {}, kT0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->nodes_size(), 1000);  // the most one answer holds
  EXPECT_TRUE(first->truncated());
  EXPECT_EQ(first->live_nodes(), 1005u);
  v1::ListClusterNodesRequest next;
  next.set_start_after(first->nodes(999).name());
  next.set_limit(3);
  auto second = view.List(next, {}, kT0);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(Names(*second), ::testing::ElementsAre("n1000", "n1001", "n1002"));
  EXPECT_TRUE(second->truncated());
  next.set_start_after("n1002");
  next.set_limit(1000);
  auto last = view.List(next, {}, kT0);
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(Names(*last), ::testing::ElementsAre("n1003", "n1004"));
  EXPECT_FALSE(last->truncated());

  v1::ListClusterNodesRequest bad;
  bad.set_limit(1001);
  auto r = view.List(bad, {}, kT0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "limit 1001 is out of range; allowed 1 to 1000 nodes per answer (0: 1000)");
  bad.set_limit(0);
  bad.set_start_after(std::string(10000, 'x'));
  r = view.List(bad, {}, kT0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("(10000 bytes) names no node; allowed: empty, or 1 "
                                              "to 128 of letters, digits and . _ - :"));
  EXPECT_LT(r.status().message().size(), 300u);  // the value is not echoed whole
}

}  // namespace
}  // namespace commd::cluster
