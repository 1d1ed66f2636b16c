#include "format/job_diagnosis.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::diagnosis {
namespace {

struct Rank {
  int global;
  uint64_t entered, completed;
};

v1::NodeGroupView View(const std::string& group, const std::string& node,
                       const std::vector<Rank>& ranks) {
  v1::NodeGroupView v;
  v.set_node(node);
  v.mutable_health()->set_group(group);
  for (const Rank& r : ranks) {
    v1::RankView* rv = v.add_ranks();
    rv->set_global_rank(r.global);
    rv->set_last_enqueued_seq(r.entered);
    rv->set_last_completed_seq(r.completed);
  }
  return v;
}

std::optional<std::string> Holdup(const std::vector<v1::NodeGroupView>& views) {
  std::vector<const v1::NodeGroupView*> p;
  for (const auto& v : views) p.push_back(&v);
  return GroupHoldup(p);
}

TEST(RankRangesTest, RunsBecomeRanges) {
  EXPECT_EQ(RankRanges({}), "");
  EXPECT_EQ(RankRanges({7}), "7");
  EXPECT_EQ(RankRanges({0, 1, 2, 3, 5, 7, 8}), "0-3, 5, 7-8");
  EXPECT_EQ(RankRanges({0, 1, 2, 3, 5, 7, 8}, 2), "0-3, 5, and 2 more");
  EXPECT_EQ(RankRanges({0, 1, 2}, 1), "0-2");
}

// A job of 1,000 nodes where every other rank of 20 nodes never entered: the sentence names 8
// nodes, counts the rest, and cuts the list of waiting ranks; it stays one short line.
TEST(GroupHoldupTest, ManyNodesBehindStayOneShortLine) {
  std::vector<v1::NodeGroupView> views;
  for (int n = 0; n < 1000; ++n) {
    std::vector<Rank> ranks;
    for (int g = n * 8; g < n * 8 + 8; ++g) {
      ranks.push_back(n < 20 && g % 2 == 1 ? Rank{g, 4, 4} : Rank{g, 5, 4});
    }
    views.push_back(View("g", absl::StrCat("node-", 1000 + n), ranks));
  }
  const std::optional<std::string> s = Holdup(views);
  ASSERT_TRUE(s.has_value());
  EXPECT_LT(s->size(), 2048u) << *s;
  EXPECT_THAT(*s, ::testing::StartsWith("group g: global ranks 1, 3, 5, 7 on node-1000 and "));
  EXPECT_THAT(*s, ::testing::HasSubstr(
                      " and 12 more node(s) (48 global rank(s)) never entered collective 5 that "
                      "global ranks 0, 2, 4, "));
  EXPECT_THAT(*s, ::testing::HasSubstr(", and 7904 more wait in (7920 of 8000 ranks entered it)"))
      << *s;
}

// The example: one rank of 32 on one node never entered the collective the 31 others,
// spread over four nodes, wait in.
TEST(GroupHoldupTest, NamesTheRankThatNeverEnteredAndTheRanksThatWait) {
  std::vector<v1::NodeGroupView> views;
  for (int n = 0; n < 4; ++n) {
    std::vector<Rank> ranks;
    for (int g = n * 8; g < n * 8 + 8; ++g) {
      ranks.push_back(g == 13 ? Rank{g, 811, 811} : Rank{g, 812, 811});
    }
    views.push_back(View("tp", std::string("node-") + static_cast<char>('a' + n), ranks));
  }
  EXPECT_EQ(Holdup(views),
            "group tp: global rank 13 on node-b never entered collective 812 that "
            "global ranks 0-12, 14-31 wait in (31 of 32 ranks entered it)");
}

// Ranks behind on several nodes are named by node, in node order whatever the views' order.
TEST(GroupHoldupTest, RanksBehindOnSeveralNodesAreNamedByNode) {
  const std::vector<v1::NodeGroupView> views = {
      View("g", "node-c", {{4, 5, 4}, {5, 4, 4}}),
      View("g", "node-a", {{0, 5, 4}, {1, 5, 4}}),
      View("g", "node-b", {{2, 3, 3}, {3, 4, 4}}),
  };
  EXPECT_EQ(Holdup(views),
            "group g: global ranks 2-3 on node-b and global rank 5 on node-c never entered "
            "collective 5 that global ranks 0-1, 4 wait in (3 of 6 ranks entered it)");
}

TEST(GroupHoldupTest, RanksThatEnteredButDidNotFinishAreNamed) {
  const std::vector<v1::NodeGroupView> views = {
      View("g", "node-a", {{0, 5, 5}, {1, 5, 5}}),
      View("g", "node-b", {{2, 5, 5}, {3, 5, 4}}),
  };
  EXPECT_EQ(Holdup(views),
            "group g: global rank 3 on node-b did not finish collective 5 that global ranks 0-2 "
            "finished (1 of 4 ranks still in it)");
}

// Every rank inside and none done (a transport that hangs): all are named, nobody finished.
TEST(GroupHoldupTest, NobodyFinishedNamesEveryRank) {
  const std::vector<v1::NodeGroupView> views = {
      View("g", "node-a", {{0, 5, 4}}),
      View("g", "node-b", {{1, 5, 4}}),
  };
  EXPECT_EQ(Holdup(views),
            "group g: global rank 0 on node-a and global rank 1 on node-b did not finish "
            "collective 5 (2 of 2 ranks still in it)");
}

TEST(GroupHoldupTest, LevelRanksSayNothing) {
  EXPECT_EQ(Holdup({View("g", "node-a", {{0, 7, 7}, {1, 7, 7}}), View("g", "node-b", {{2, 7, 7}})}),
            std::nullopt);
  // No collective yet, and no view at all.
  EXPECT_EQ(Holdup({View("g", "node-a", {{0, 0, 0}}), View("g", "node-b", {{1, 0, 0}})}),
            std::nullopt);
  EXPECT_EQ(Holdup({}), std::nullopt);
}

TEST(JobDiagnosisTest, OneSentencePerGroupThatWaits) {
  google::protobuf::RepeatedPtrField<v1::NodeGroupView> views;
  *views.Add() = View("tp", "node-b", {{1, 9, 8}});
  *views.Add() = View("dp", "node-a", {{0, 3, 3}});
  *views.Add() = View("tp", "node-a", {{0, 8, 8}});
  *views.Add() = View("dp", "node-b", {{1, 3, 3}});
  const std::vector<std::string> lines = JobDiagnosis(views);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "group tp: global rank 0 on node-a never entered collective 9 that global rank 1 "
            "waits in (1 of 2 ranks entered it)");
}

}  // namespace
}  // namespace commd::diagnosis
