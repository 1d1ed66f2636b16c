#include "daemon/watchdog/cluster_events.h"

#include <string>

#include "gtest/gtest.h"

namespace commd::watchdog {
namespace {

// Group "tp" of job "j" (uid 1000), formed, over nodes a (global ranks 0, 1; this node), b
// (2, 3) and c (4, 5), in formation 77.
groups::GroupSnapshot Spanning() {
  groups::GroupSnapshot g;
  g.id = 9;
  g.uid = 1000;
  g.job_id = "j";
  g.name = "tp";
  g.active = true;
  g.world_size = 2;
  g.global_world_size = 6;
  int rank = 0;
  for (const char* node : {"a", "b", "c"}) {
    v1::NodeRanks* n = g.layout.add_nodes();
    n->set_node(node);
    n->add_global_ranks(rank++);
    n->add_global_ranks(rank++);
  }
  g.layout.set_this_node(0);
  g.layout.set_formation(77);
  return g;
}

groups::GroupSnapshot NodeLocal() {
  groups::GroupSnapshot g = Spanning();
  g.global_world_size = 0;
  g.layout.Clear();
  return g;
}

TEST(ClusterEventsTest, ANodeGoneIsAFactOnTheFormedGroupsSpanningIt) {
  const std::optional<ClusterFact> f =
      NodeGoneFact(Spanning(), "b", 41, "its commd's lease in etcd ended");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->group.id, 9u);
  EXPECT_EQ(f->diagnosis.kind(), v1::DEAD);
  EXPECT_EQ(f->diagnosis.job_id(), "j");
  EXPECT_EQ(f->diagnosis.uid(), 1000u);
  EXPECT_EQ(f->diagnosis.group(), "tp");
  EXPECT_EQ(f->diagnosis.summary(),
            "group tp: node b (global rank(s) [2, 3]) is gone: its commd's lease in etcd ended");
  EXPECT_EQ(f->diagnosis.detected_unix_ms(), 0);  // the watchdog stamps it
  EXPECT_EQ(f->key, "node:b");
  EXPECT_STREQ(f->trigger, "node_lost");
  // Every node derives the same id from the node and the revision: their dumps meet.
  EXPECT_EQ(f->dump.dump_id, "node_lost-b-r41");
  EXPECT_FALSE(f->dump.local_only);

  EXPECT_FALSE(NodeGoneFact(Spanning(), "a", 41, "gone").has_value());  // this node
  EXPECT_FALSE(NodeGoneFact(Spanning(), "z", 41, "gone").has_value());  // not the group's
  EXPECT_FALSE(NodeGoneFact(NodeLocal(), "b", 41, "gone").has_value());
  groups::GroupSnapshot forming = Spanning();
  forming.active = false;
  EXPECT_FALSE(NodeGoneFact(forming, "b", 41, "gone").has_value());
}

TEST(ClusterEventsTest, ALostLeaseIsAFactOnEveryFormedSpanningGroupDumpedHereOnly) {
  const std::optional<ClusterFact> f = LeaseLostFact(Spanning(), "keep-alive failed");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->diagnosis.kind(), v1::DEAD);
  EXPECT_EQ(f->diagnosis.summary(),
            "group tp: this node (a) lost its lease in etcd (keep-alive failed); the group's "
            "other nodes count it as gone");
  EXPECT_EQ(f->key, "lease_lost");
  EXPECT_STREQ(f->trigger, "lease_lost");
  EXPECT_TRUE(f->dump.local_only);
  EXPECT_TRUE(f->dump.dump_id.empty());

  groups::GroupSnapshot unplaced = Spanning();
  unplaced.layout.set_this_node(7);
  EXPECT_NE(LeaseLostFact(unplaced, "x")->diagnosis.summary().find("this node (?)"),
            std::string::npos);
  EXPECT_FALSE(LeaseLostFact(NodeLocal(), "x").has_value());
  groups::GroupSnapshot forming = Spanning();
  forming.active = false;
  EXPECT_FALSE(LeaseLostFact(forming, "x").has_value());
}

TEST(ClusterEventsTest, AnotherNodesAbortMeetsOnlyTheSameFormation) {
  const SpanAbortNotice notice{.uid = 1000,
                               .job_id = "j",
                               .group = "tp",
                               .formation = 77,
                               .reason = AbortReason::kStuck,
                               .text = "stuck in all_reduce #5",
                               .node = "b"};
  EXPECT_TRUE(IsFormationOf(Spanning(), notice));
  EXPECT_EQ(RemoteAbortText(notice), "aborted on node b: stuck in all_reduce #5");

  SpanAbortNotice other = notice;
  other.formation = 78;  // the group formed again since
  EXPECT_FALSE(IsFormationOf(Spanning(), other));
  other = notice;
  other.uid = 1001;
  EXPECT_FALSE(IsFormationOf(Spanning(), other));
  other = notice;
  other.job_id = "k";
  EXPECT_FALSE(IsFormationOf(Spanning(), other));
  other = notice;
  other.group = "dp";
  EXPECT_FALSE(IsFormationOf(Spanning(), other));
  EXPECT_FALSE(IsFormationOf(NodeLocal(), notice));
  groups::GroupSnapshot forming = Spanning();
  forming.active = false;
  EXPECT_FALSE(IsFormationOf(forming, notice));
}

}  // namespace
}  // namespace commd::watchdog
