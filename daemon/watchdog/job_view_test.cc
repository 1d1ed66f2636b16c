#include "daemon/watchdog/job_view.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::watchdog {
namespace {

using ::testing::HasSubstr;

struct Rank {
  int global;
  uint64_t entered, completed;
};

void AddRanks(const std::vector<Rank>& ranks,
              google::protobuf::RepeatedPtrField<v1::RankView>* out) {
  for (const Rank& r : ranks) {
    v1::RankView* rv = out->Add();
    rv->set_global_rank(r.global);
    rv->set_last_enqueued_seq(r.entered);
    rv->set_last_completed_seq(r.completed);
  }
}

v1::NodeGroupView View(const std::string& node, const std::vector<Rank>& ranks,
                       const std::string& group = "g") {
  v1::NodeGroupView v;
  v.set_node(node);
  v.mutable_health()->set_group(group);
  AddRanks(ranks, v.mutable_ranks());
  return v;
}

// node-a (this node: global ranks 0, 1) and node-b (2, 3).
v1::GroupLayout Layout(const std::vector<std::string>& nodes = {"node-a", "node-b"}) {
  v1::GroupLayout l;
  for (const std::string& n : nodes) l.add_nodes()->set_node(n);
  l.set_this_node(0);
  return l;
}

v1::NodeGroupView Local() {
  v1::Diagnosis d;
  d.set_group("g");
  d.set_job_id("job");
  AddRanks({{0, 5, 4}, {1, 5, 4}}, d.mutable_ranks());
  return LocalView(d, Layout());
}

TEST(JobViewTest, LocalViewIsThisNodesRanksAsTheFindingSawThem) {
  const v1::NodeGroupView v = Local();
  EXPECT_EQ(v.node(), "node-a");
  EXPECT_EQ(v.health().group(), "g");
  ASSERT_EQ(v.ranks_size(), 2);
  EXPECT_EQ(v.ranks(1).last_enqueued_seq(), 5u);
}

// This node's published view is older than its finding: the finding's ranks stand in for it.
TEST(JobViewTest, NamesThePeersRankWithThisNodesFreshView) {
  const std::vector<v1::NodeGroupView> read = {View("node-a", {{0, 4, 4}, {1, 4, 4}}),
                                               View("node-b", {{2, 5, 4}, {3, 4, 4}})};
  EXPECT_EQ(JobViewSummary(read, Local(), Layout()),
            "group g: global rank 3 on node-b never entered collective 5 that global ranks 0-2 "
            "wait in (3 of 4 ranks entered it)");
}

TEST(JobViewTest, ANodeWithoutAViewIsNamed) {
  const std::vector<v1::NodeGroupView> read = {View("node-b", {{2, 5, 4}, {3, 4, 4}})};
  EXPECT_THAT(JobViewSummary(read, Local(), Layout({"node-a", "node-b", "node-c"})),
              HasSubstr("global rank 3 on node-b never entered collective 5 that global ranks "
                        "0-2 wait in (3 of 4 ranks entered it); no view from node(s) node-c"));
}

// Past kMaxNodesNamed nodes without a view, the rest are counted.
TEST(JobViewTest, ManyNodesWithoutAViewAreCounted) {
  std::vector<std::string> nodes = {"node-a"};
  for (int n = 0; n < 20; ++n) nodes.push_back(absl::StrCat("node-x", 10 + n));
  const std::vector<v1::NodeGroupView> read;
  EXPECT_THAT(JobViewSummary(read, Local(), Layout(nodes)),
              HasSubstr("; no view from node(s) node-x10, node-x11, node-x12, node-x13, "
                        "node-x14, node-x15, node-x16, node-x17, and 12 more"));
}

// A node outside this formation's layout (an older formation's key) and another group are not
// counted.
TEST(JobViewTest, ViewsOfOtherNodesAndGroupsAreLeftOut) {
  const std::vector<v1::NodeGroupView> read = {View("node-b", {{2, 5, 4}, {3, 5, 4}}),
                                               View("node-z", {{7, 1, 1}}),
                                               View("node-b", {{2, 1, 1}}, "other")};
  EXPECT_EQ(JobViewSummary(read, Local(), Layout()),
            "group g: global ranks 0-1 on node-a and global ranks 2-3 on node-b did not finish "
            "collective 5 (4 of 4 ranks still in it)");
}

TEST(JobViewTest, LevelViewsSaySoRatherThanNothing) {
  v1::Diagnosis d;
  d.set_group("g");
  AddRanks({{0, 5, 5}, {1, 5, 5}}, d.mutable_ranks());
  const std::vector<v1::NodeGroupView> read = {View("node-b", {{2, 5, 5}, {3, 5, 5}})};
  EXPECT_EQ(JobViewSummary(read, LocalView(d, Layout()), Layout()),
            "group g: no global rank is behind in the 2 node(s)' views");
}

// What one uid's hung groups can make a node hold: one wait per group, 8 per uid; another
// uid's waits count for that uid only.
TEST(JobViewTest, WaitsAreBoundedPerGroupAndPerUid) {
  std::vector<JobViewWaiter> waiting;
  EXPECT_EQ(JobViewRefusal(1000, 1, waiting), std::nullopt);
  for (uint64_t g = 1; g <= kMaxJobViewWaitsPerUid; ++g) waiting.push_back({1000, g});
  for (uint64_t g = 100; g < 105; ++g) waiting.push_back({2000, g});
  EXPECT_EQ(
      JobViewRefusal(1000, 3, waiting),
      "other nodes' views unavailable: the group's previous finding is still reading it; this "
      "diagnosis is this node's alone");
  EXPECT_EQ(
      JobViewRefusal(1000, 50, waiting),
      "other nodes' views unavailable: uid 1000 has 8 findings reading the nodes' views already "
      "(at most 8); this diagnosis is this node's alone");
  EXPECT_EQ(JobViewRefusal(3000, 50, waiting), std::nullopt);
  waiting.erase(waiting.begin());
  EXPECT_EQ(JobViewRefusal(1000, 50, waiting), std::nullopt);
}

TEST(JobViewTest, AFailedReadFallsBackSayingWhy) {
  const std::string s = JobViewSummary(
      absl::UnavailableError("etcd at 127.0.0.1:1 is not reachable"), Local(), Layout());
  EXPECT_EQ(
      s,
      "other nodes' views unavailable: etcd at 127.0.0.1:1 is not reachable; this diagnosis is "
      "node node-a's alone");
}

}  // namespace
}  // namespace commd::watchdog
