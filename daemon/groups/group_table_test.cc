// The group table (group_table.h) and the selector (group_snapshot.h).
#include "daemon/groups/group_table.h"

#include "absl/strings/match.h"
#include "daemon/groups/group_snapshot.h"
#include "gtest/gtest.h"

namespace commd::groups {
namespace {

server::Session Session(uid_t uid, const std::string& job, const std::string& token = "t") {
  return {.token = token, .job_id = job, .uid = uid};
}

v1::JoinGroupRequest Request(const std::string& name, int world_size = 2) {
  v1::JoinGroupRequest r;
  r.set_name(name);
  r.set_world_size(world_size);
  return r;
}

std::shared_ptr<Group> Create(GroupTable& table, uid_t uid, const std::string& job,
                              const std::string& name) {
  bool created = false;
  auto g = table.FindOrCreate(Session(uid, job), Request(name), absl::Seconds(5), &created);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(GroupTableTest, AGroupIsNamedWithinItsUidAndJob) {
  GroupTable table({});
  auto a = Create(table, 1001, "j", "g");
  EXPECT_EQ(Create(table, 1001, "j", "g"), a);
  EXPECT_NE(Create(table, 1001, "k", "g"), a);
  EXPECT_NE(Create(table, 1002, "j", "g"), a);
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(a->world_size, 2);
  EXPECT_EQ(a->members.size(), 2u);
  EXPECT_EQ(table.Find(a->id), a);
  table.Remove(*a);
  EXPECT_EQ(table.Find(a->id), nullptr);
  EXPECT_NE(Create(table, 1001, "j", "g"), a);  // the name is free at once
}

TEST(GroupTableTest, EachUidHasItsShareOfRendezvousSlots) {
  GroupTable table({.max_groups = 10, .max_groups_forming_per_uid = 2});
  auto first = Create(table, 1001, "j", "a");
  Create(table, 1001, "j", "b");
  bool created = false;
  auto third = table.FindOrCreate(Session(1001, "j"), Request("c"), absl::Seconds(5), &created);
  ASSERT_FALSE(third.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(third.status().message(), "limits.per_uid.groups_forming"))
      << third.status();
  Create(table, 1002, "j", "c");  // another uid's share
  // A formed group gives its slot back.
  first->active = true;
  table.Formed(*first);
  Create(table, 1001, "j", "c");
}

TEST(GroupTableTest, TheNodeWideLimitNamesItsField) {
  GroupTable table({.max_groups = 2, .max_groups_forming_per_uid = 8});
  Create(table, 1001, "j", "a");
  Create(table, 1002, "j", "b");
  bool created = false;
  auto over = table.FindOrCreate(Session(1003, "j"), Request("c"), absl::Seconds(5), &created);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().message(), "group limit reached: 2 groups (limits.max_groups)");
}

TEST(GroupTableTest, ASnapshotChangesOnlyWhenPublishedAndNeverAfter) {
  GroupTable table({});
  EXPECT_TRUE(table.Snapshot()->groups.empty());
  auto g = Create(table, 1001, "j", "g");
  EXPECT_TRUE(table.Snapshot()->groups.empty());
  table.Publish();
  const auto published = table.Snapshot();
  ASSERT_EQ(published->groups.size(), 1u);
  EXPECT_EQ(published->groups[0].name, "g");
  EXPECT_FALSE(published->groups[0].active);
  table.Remove(*g);
  table.Publish();
  EXPECT_TRUE(table.Snapshot()->groups.empty());
  EXPECT_EQ(published->groups.size(), 1u);  // a reader's copy stays as it was
}

TEST(GroupTableTest, FindsTheRankASessionHolds) {
  GroupTable table({});
  auto g = Create(table, 1001, "j", "g");
  auto session = std::make_shared<const server::Session>(Session(1001, "j", "tok"));
  g->members[1].joined = true;
  g->members[1].session = session;
  int rank = -1;
  EXPECT_EQ(table.FindForMember(*session, g->id, &rank), g.get());
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(table.FindForMember(Session(1001, "j", "other"), g->id, &rank), nullptr);
  g->members[1].gone = true;
  EXPECT_EQ(table.FindForMember(*session, g->id, &rank), nullptr);
}

TEST(GroupSelectorTest, SelectsByJobUidAndName) {
  GroupsSnapshot s;
  s.groups.push_back({.id = 1, .uid = 1001, .job_id = "a", .name = "g", .active = true});
  s.groups.push_back({.id = 2, .uid = 1002, .job_id = "a", .name = "g", .active = true});
  s.groups.push_back({.id = 3, .uid = 1001, .job_id = "b", .name = "h", .active = false});
  auto ids = [&](const GroupSelector& sel, bool active_only) {
    std::vector<uint64_t> out;
    for (const GroupSnapshot* g : Select(s, sel, active_only)) out.push_back(g->id);
    return out;
  };
  EXPECT_EQ(ids({}, false), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(ids({}, true), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(ids({.job = std::make_pair(1001u, std::string("a"))}, false),
            (std::vector<uint64_t>{1}));
  EXPECT_EQ(ids({.job_any_uid = "a"}, false), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(ids({.group = "h"}, false), (std::vector<uint64_t>{3}));
}

TEST(GroupSelectorTest, ASessionNamesOnlyItsOwnJobUnlessAdmin) {
  const server::Session user{.token = "u", .job_id = "a", .uid = 1001};
  auto own = SelectorFor(user, "", false, "g");
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->job, std::make_pair(uid_t{1001}, std::string("a")));
  EXPECT_EQ(own->group, "g");
  auto other = SelectorFor(user, "b", false, "");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.status().message(), R"(no job "b" visible to this session)");
  EXPECT_EQ(SelectorFor(user, "", true, "").status().message(),
            "no job (all) visible to this session");

  const server::Session admin{.token = "r", .job_id = "a", .uid = 0, .admin = true};
  auto named = SelectorFor(admin, "b", false, "");
  ASSERT_TRUE(named.ok());
  EXPECT_FALSE(named->job.has_value());
  EXPECT_EQ(named->job_any_uid, "b");
  auto all = SelectorFor(admin, "", true, "");
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(all->job.has_value() || all->job_any_uid.has_value());
}

}  // namespace
}  // namespace commd::groups
