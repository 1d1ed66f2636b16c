// Groups that span nodes (docs/cluster.md, "Groups that span nodes") against a real etcd on
// loopback: real daemons as nodes, real rank processes (span_rank) joining one group from
// several nodes. Covers the layout every rank learns (2 nodes x 2 ranks, 3 uneven nodes), each
// error of the rendezvous between nodes, what is left behind (nothing), the per-uid share and
// what another uid sees (nothing); and the collectives across nodes (span_collective_rank):
// every collective, type and overload checked element by element, a call that differs across
// nodes, NaN under policy FAIL, a node that never calls.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/span_fixture.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class SpanTest : public SpanFixture {
 protected:
  // Dump `id` of job "job" as the job's operator gathers it: `commctl fr collect` of every
  // node's dump dir into one directory (group g: global ranks 0-3, each once), `commctl fr
  // export --format torch`, and torchfrtrace over it, whose report names the collective the
  // ranks wait in and `missing` (the global rank that never entered it).
  void ExpectTorchfrtraceNamesTheMissingRank(const std::vector<DaemonProcess*>& n,
                                             const std::string& id, const std::string& missing) {
    // Each node's dumps beside its runtime dir (the test launcher's STATE_DIRECTORY).
    auto dumps = [](const DaemonProcess& d) {
      return (std::filesystem::path(d.runtime_dir()).parent_path() / "state" / "dumps").string();
    };
    const std::string out = tmp_.Join("collected-" + id);
    std::vector<std::string> collect_argv = {COMMCTL_BINARY, "fr", "collect", "--dump-id", id,
                                             "--out",        out};
    for (const DaemonProcess* node : n) collect_argv.push_back(dumps(*node));
    ProcessResult collect;
    EXPECT_TRUE(Eventually([&] {
      std::filesystem::remove_all(out);
      collect = RunProcess(collect_argv);
      return collect.exit_code == 0 && absl::StrContains(collect.output, "global ranks 0-3");
    })) << collect.output;
    EXPECT_THAT(collect.output, HasSubstr("group g: global ranks 0-3 (4 of 4)"));
    const std::string torch = tmp_.Join("torch-" + id);
    const ProcessResult exported = RunProcess(
        {COMMCTL_BINARY, "fr", "export", "--in", out + "/g", "--out", torch, "--format", "torch"});
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    for (int g = 0; g < 4; ++g) {
      EXPECT_TRUE(std::filesystem::exists(absl::StrCat(torch, "/nccl_trace_rank_", g)));
    }
#ifdef COMMD_TORCH_PYTHON
    const ProcessResult report =
        RunProcess({COMMD_TORCH_PYTHON, "-m", "torch.distributed.flight_recorder.fr_trace", torch,
                    "--prefix", "nccl_trace_rank_", "-o", tmp_.Join("db-" + id)},
                   absl::Seconds(300));
    ASSERT_EQ(report.exit_code, 0) << report.output;
    EXPECT_THAT(report.output, HasSubstr("collective: nccl:all_reduce")) << report.output;
    EXPECT_THAT(report.output, HasSubstr(missing)) << report.output;
    std::cerr << report.output;
#else
    std::cerr << "torchfrtrace not run: this build has no COMMD_TORCH_PYTHON\n";
#endif
  }
};

// Global ranks interleaved over the nodes: the layout says which is where, by local rank.
TEST_F(SpanTest, TwoNodesOfTwoRanksLearnOneLayout) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<std::string> logs =
      Run({{.node = n[0], .rank = 0, .world = 2, .global_rank = 0, .global_world = 4},
           {.node = n[0], .rank = 1, .world = 2, .global_rank = 2, .global_world = 4},
           {.node = n[1], .rank = 0, .world = 2, .global_rank = 1, .global_world = 4},
           {.node = n[1], .rank = 1, .world = 2, .global_rank = 3, .global_world = 4}});
  for (size_t i = 0; i < logs.size(); ++i) {
    EXPECT_EQ(Line(logs[i], "layout "), absl::StrCat("layout 4 ", i / 2, " node-a:0,2;node-b:1,3"))
        << logs[i];
    // Collectives run across the nodes (SpanTest.*Collectives* check their results).
    EXPECT_EQ(Line(logs[i], "allreduce "), "allreduce OK ");
    EXPECT_EQ(Line(logs[i], "barrier "), "barrier OK ");
  }
  EXPECT_THAT(etcd_->Keys(GroupKeys()),
              ::testing::ElementsAre(GroupKeys() + "node-a", GroupKeys() + "node-b"));
  // The node's key goes when the group's last local rank leaves.
  LeaveAll();
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }))
      << absl::StrJoin(etcd_->Keys(absl::StrCat(kPrefix, "/jobs/")), " ");
}

TEST_F(SpanTest, ThreeUnevenNodesLearnOneLayout) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-c", "node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  // node-c: 1 rank, node-a: 2, node-b: 3; sorted by name in the layout.
  const std::vector<std::string> logs = Run({
      {.node = n[0], .rank = 0, .world = 1, .global_rank = 5, .global_world = 6},
      {.node = n[1], .rank = 0, .world = 2, .global_rank = 0, .global_world = 6},
      {.node = n[1], .rank = 1, .world = 2, .global_rank = 3, .global_world = 6},
      {.node = n[2], .rank = 0, .world = 3, .global_rank = 4, .global_world = 6},
      {.node = n[2], .rank = 1, .world = 3, .global_rank = 1, .global_world = 6},
      {.node = n[2], .rank = 2, .world = 3, .global_rank = 2, .global_world = 6},
  });
  const int node_index[] = {2, 0, 0, 1, 1, 1};
  for (size_t i = 0; i < logs.size(); ++i) {
    EXPECT_EQ(Line(logs[i], "layout "),
              absl::StrCat("layout 6 ", node_index[i], " node-a:0,3;node-b:4,1,2;node-c:5"))
        << logs[i];
  }
  EXPECT_EQ(etcd_->Keys(GroupKeys()).size(), 3u);
  LeaveAll();
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

TEST_F(SpanTest, NodesThatDisagreeOnTheGlobalWorldSizeBothFail) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<std::string> logs =
      Run({{.node = n[0], .rank = 0, .world = 1, .global_rank = 0, .global_world = 2},
           {.node = n[1], .rank = 0, .world = 1, .global_rank = 1, .global_world = 3}});
  EXPECT_EQ(Line(logs[0], "join "),
            "join FAILED_PRECONDITION group g: node \"node-b\" gives global world size 3 but node "
            "\"node-a\" (this node) gives 2; every rank on every node must give the same");
  EXPECT_EQ(Line(logs[1], "join "),
            "join FAILED_PRECONDITION group g: node \"node-a\" gives global world size 2 but node "
            "\"node-b\" (this node) gives 3; every rank on every node must give the same");
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

TEST_F(SpanTest, TwoNodesClaimingOneGlobalRankBothFail) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<std::string> logs =
      Run({{.node = n[0], .rank = 0, .world = 1, .global_rank = 1, .global_world = 2},
           {.node = n[1], .rank = 0, .world = 1, .global_rank = 1, .global_world = 2}});
  for (const std::string& log : logs) {
    EXPECT_EQ(Line(log, "join "),
              "join FAILED_PRECONDITION group g: global rank 1 is claimed by node \"node-a\" and "
              "node \"node-b\"; each global rank must be on one node")
        << log;
  }
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

// Refused before the daemon keeps anything, let alone something per global rank.
TEST_F(SpanTest, GlobalRanksAndSizesOutOfRangeAreRefused) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a"}, &n);
  if (HasFatalFailure()) return;
  auto client = Connect(*n[0]);
  ASSERT_NE(client, nullptr);
  auto out_of_range = client->JoinGroup(
      {.name = "g", .rank = 0, .world_size = 1, .global_rank = 4, .global_world_size = 4});
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.status().message(),
            "global rank 4 for group g of global world size 4; allowed 0 to 3 (a group spanning "
            "nodes needs each rank's global rank)");
  for (int huge : {kMaxGlobalWorldSize + 1, 1 << 30, -2}) {
    auto r = client->JoinGroup(
        {.name = "g", .rank = 0, .world_size = 1, .global_rank = 0, .global_world_size = huge});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              absl::StrCat("global world size ", huge,
                           " for group g of world size 1 on this node; allowed 0 (the group is on "
                           "this node only) or 1 to 16384 (a group spanning nodes)"));
  }
  EXPECT_TRUE(NothingLeft());
}

TEST_F(SpanTest, ANodeThatNeverComesIsNamedAtTheDeadline) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<std::string> logs = Run({{.node = n[0],
                                              .rank = 0,
                                              .world = 2,
                                              .global_rank = 0,
                                              .global_world = 5,
                                              .timeout_ms = 1500},
                                             {.node = n[0],
                                              .rank = 1,
                                              .world = 2,
                                              .global_rank = 1,
                                              .global_world = 5,
                                              .timeout_ms = 1500}});
  for (const std::string& log : logs) {
    EXPECT_EQ(Line(log, "join "),
              "join DEADLINE_EXCEEDED group g spans nodes and did not form within 1.5s: global "
              "rank(s) [2-4] never joined (nodes joined: node-a [0-1]) (global world size 5)")
        << log;
  }
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

TEST_F(SpanTest, UnreachableEtcdIsUnavailableNamingIt) {
  const std::string nowhere = absl::StrCat("127.0.0.1:", FreePort());
  DaemonProcess* node = StartNode("node-a", "", nowhere);
  ASSERT_NE(node, nullptr);
  auto client = Connect(*node);
  ASSERT_NE(client, nullptr);
  auto r = client->JoinGroup(
      {.name = "g", .rank = 0, .world_size = 1, .global_rank = 0, .global_world_size = 2});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("etcd at " + nowhere));
  EXPECT_EQ(MetricValue(*node, "commd_groups"), 0);
}

// etcd lost while the ranks wait for the other nodes: the watch breaks, and they hear it.
TEST_F(SpanTest, EtcdLostWhileWaitingIsUnavailableNamingIt) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a"}, &n);
  if (HasFatalFailure()) return;
  ChildProcess* rank = StartRank({.node = n[0], .global_world = 2});
  ASSERT_NE(rank, nullptr);
  ASSERT_TRUE(Eventually([&] { return etcd_->Keys(GroupKeys()).size() == 1; }));
  etcd_->Kill();
  ASSERT_TRUE(rank->WaitForLog("join ", absl::Seconds(30))) << rank->Log();
  const std::string join = Line(rank->Log(), "join ");
  EXPECT_THAT(join, StartsWith("join UNAVAILABLE ")) << join;
  EXPECT_THAT(join, HasSubstr("etcd at " + etcd_->endpoint())) << join;
  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[0], "commd_groups") == 0; }));
}

// This node's part gone from etcd while its ranks wait (its lease expired while etcd was out
// of reach, or an operator deleted it): the other nodes can no longer see it, so the ranks
// hear it instead of waiting for their deadline.
TEST_F(SpanTest, APartThatVanishesFailsItsRanks) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a"}, &n);
  if (HasFatalFailure()) return;
  ChildProcess* rank = StartRank({.node = n[0], .global_world = 2});
  ASSERT_NE(rank, nullptr);
  ASSERT_TRUE(Eventually([&] { return etcd_->Keys(GroupKeys()).size() == 1; }));
  etcd_->Delete(GroupKeys() + "node-a");
  ASSERT_TRUE(rank->WaitForLog("join ", absl::Seconds(30))) << rank->Log();
  EXPECT_THAT(Line(rank->Log(), "join "),
              StartsWith("join UNAVAILABLE this node's part of group g vanished from etcd at " +
                         etcd_->endpoint()));
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

// The node's part hangs on its lease: a daemon that dies takes it along, and the other nodes
// wait for its ranks again.
TEST_F(SpanTest, ADeadDaemonsPartGoesWithItsLease) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  ChildProcess* on_a = StartRank({.node = n[0], .global_rank = 0, .global_world = 3});
  ChildProcess* on_b = StartRank({.node = n[1], .global_rank = 1, .global_world = 3});
  ASSERT_NE(on_a, nullptr);
  ASSERT_NE(on_b, nullptr);
  ASSERT_TRUE(Eventually([&] { return etcd_->Keys(GroupKeys()).size() == 2; }));
  ASSERT_TRUE(n[0]->Stop(SIGKILL).ok());
  // lease_ttl_ms 2000: etcd drops node-a's part soon after; node-b's stays.
  EXPECT_TRUE(Eventually([&] {
    return etcd_->Keys(GroupKeys()) == std::vector<std::string>{GroupKeys() + "node-b"};
  }));
  EXPECT_EQ(Line(on_b->Log(), "join "), "");  // still waiting
  // Its rank gone, node-b's part goes too.
  ASSERT_TRUE(on_b->Stop().ok());
  EXPECT_TRUE(Eventually([&] { return etcd_->Keys(absl::StrCat(kPrefix, "/jobs/")).empty(); }));
}

// A node whose daemon dies after the group formed: its lease ends, and the group's ranks on the
// other nodes are aborted naming the node and its global ranks, with a diagnosis and a dump.
TEST_F(SpanTest, ADeadNodeAbortsTheGroupOnTheOtherNodesNamingIt) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  ChildProcess* on_a = StartRank({.node = n[0], .global_rank = 0, .global_world = 3});
  ChildProcess* on_b0 =
      StartRank({.node = n[1], .rank = 0, .world = 2, .global_rank = 1, .global_world = 3});
  ChildProcess* on_b1 =
      StartRank({.node = n[1], .rank = 1, .world = 2, .global_rank = 2, .global_world = 3});
  ASSERT_TRUE(on_a && on_b0 && on_b1);
  ASSERT_TRUE(on_a->WaitForLog("joined", absl::Seconds(60))) << on_a->Log();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(n[1]->Stop(SIGKILL).ok());
  // Within the lease TTL (2 s) and a poll: generous here, the machine is shared.
  ASSERT_TRUE(on_a->WaitForLog("abort_seen_unix_us ", absl::Seconds(60))) << on_a->Log();
  {
    int64_t seen_us = 0;
    const std::string seen = Line(on_a->Log(), "abort_seen_unix_us ");
    if (absl::SimpleAtoi(seen.substr(seen.find(' ') + 1), &seen_us)) {
      std::cerr << "node-b's daemon killed; node-a's rank saw the group aborted "
                << (seen_us - absl::ToUnixMicros(killed)) / 1000.0
                << " ms later (lease TTL 2000 ms)\n";
    }
  }
  EXPECT_THAT(Line(on_a->Log(), "aborted "),
              HasSubstr("node node-b (global rank(s) [1, 2]) is gone: its commd's lease in etcd "
                        "ended"));
  auto client = Client::Connect({.runtime_dir = n[0]->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto health = (*client)->GetHealth("g");
  ASSERT_TRUE(health.ok()) << health.status();
  ASSERT_EQ(health->groups_size(), 1);
  EXPECT_EQ(health->groups(0).state(), v1::ABORTED);
  EXPECT_EQ(health->groups(0).last_diagnosis().kind(), v1::DEAD);
  EXPECT_THAT(health->groups(0).last_diagnosis().summary(), HasSubstr("node node-b"));
  // Its dump, under the id every node derives alike from the loss (the dump dir is the
  // default, $STATE_DIRECTORY/dumps, which the test launcher puts beside the runtime dir).
  const std::string dumps =
      (std::filesystem::path(n[0]->runtime_dir()).parent_path() / "state/dumps/job").string();
  std::string id;
  EXPECT_TRUE(Eventually([&] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dumps, ec)) {
      if (absl::StartsWith(e.path().filename().string(), "node_lost-node-b-r") &&
          std::filesystem::exists(e.path() / "g" / "rank0.json")) {
        id = e.path().filename().string();
      }
    }
    return !id.empty();
  })) << dumps;
}

TEST_F(SpanTest, WithoutAClusterASpanningJoinIsRefused) {
  DaemonProcess* node = StartNode("solo", "", "", /*clustered=*/false);
  ASSERT_NE(node, nullptr);
  auto client = Connect(*node);
  ASSERT_NE(client, nullptr);
  auto r = client->JoinGroup(
      {.name = "g", .rank = 0, .world_size = 1, .global_rank = 0, .global_world_size = 2});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "group g spans nodes (global world size 2 > its world size 1 on this node), which "
            "needs a cluster; this daemon has none (add a cluster section naming etcd: "
            "docs/cluster.md)");
  // A node-local group is what it always was.
  auto local = client->JoinGroup({.name = "l", .rank = 0, .world_size = 1});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->global_world_size(), 1);
  EXPECT_TRUE((*local)->layout().empty());
  EXPECT_EQ((*local)->node_index(), -1);
  EXPECT_TRUE((*local)->Barrier().ok());
}

TEST_F(SpanTest, AUidsSpanningGroupsAreBoundedPerNode) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a"}, &n, "limits { per_uid { spanning_groups: 1 } }\n");
  if (HasFatalFailure()) return;
  ChildProcess* first = StartRank({.node = n[0],
                                   .rank = 0,
                                   .world = 1,
                                   .global_rank = 0,
                                   .global_world = 2,
                                   .timeout_ms = 60000});
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(Eventually([&] { return etcd_->Keys(GroupKeys()).size() == 1; }));
  auto client = Connect(*n[0]);
  ASSERT_NE(client, nullptr);
  auto second = client->JoinGroup(
      {.name = "g2", .rank = 0, .world_size = 1, .global_rank = 0, .global_world_size = 2});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(second.status().message(),
            "uid 0 holds 1 of its 1 groups spanning nodes (limits.per_uid.spanning_groups)");
  EXPECT_TRUE(etcd_->Keys(GroupKeys("0", "job", "g2")).empty());
  // The first leaves (its process ends): the share comes back.
  ASSERT_TRUE(first->Stop().ok());
  ASSERT_TRUE(Eventually([&] { return NothingLeft(); }));
  auto third = client->JoinGroup({.name = "g3",
                                  .rank = 0,
                                  .world_size = 1,
                                  .global_rank = 0,
                                  .global_world_size = 2,
                                  .timeout = absl::Milliseconds(500)});
  EXPECT_EQ(third.status().code(), absl::StatusCode::kDeadlineExceeded) << third.status();
}

// Another uid's job of the same id and group name meets nothing of this uid's, and the other
// way round: each waits for its own missing rank.
TEST_F(SpanTest, AnotherUidsSameJobSeesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a rank as another uid (setpriv)";
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<std::string> logs = Run({{.node = n[0],
                                              .rank = 0,
                                              .world = 1,
                                              .global_rank = 0,
                                              .global_world = 2,
                                              .timeout_ms = 3000},
                                             {.node = n[1],
                                              .rank = 0,
                                              .world = 1,
                                              .global_rank = 1,
                                              .global_world = 2,
                                              .timeout_ms = 3000,
                                              .as_nobody = true}});
  EXPECT_THAT(Line(logs[0], "join "),
              HasSubstr("global rank(s) [1] never joined (nodes joined: node-a [0])"));
  EXPECT_THAT(Line(logs[1], "join "),
              HasSubstr("global rank(s) [0] never joined (nodes joined: node-b [1])"));
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

// Every collective, type, count and overload across 2 nodes of 2 ranks (global ranks
// interleaved) and 3 uneven nodes (1, 2 and 3 ranks), each element checked against what every
// global rank contributed.
TEST_F(SpanTest, CollectivesAcrossNodesGiveEveryGlobalRanksResult) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b", "node-c"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<std::vector<RankSpec>> shapes = {
      {{.node = n[0], .rank = 0, .world = 2, .global_rank = 0, .global_world = 4},
       {.node = n[0], .rank = 1, .world = 2, .global_rank = 2, .global_world = 4},
       {.node = n[1], .rank = 0, .world = 2, .global_rank = 1, .global_world = 4},
       {.node = n[1], .rank = 1, .world = 2, .global_rank = 3, .global_world = 4}},
      {{.node = n[2], .rank = 0, .world = 1, .global_rank = 5, .global_world = 6},
       {.node = n[0], .rank = 0, .world = 2, .global_rank = 0, .global_world = 6},
       {.node = n[0], .rank = 1, .world = 2, .global_rank = 3, .global_world = 6},
       {.node = n[1], .rank = 0, .world = 3, .global_rank = 4, .global_world = 6},
       {.node = n[1], .rank = 1, .world = 3, .global_rank = 1, .global_world = 6},
       {.node = n[1], .rank = 2, .world = 3, .global_rank = 2, .global_world = 6}}};
  int shape = 0;
  for (std::vector<RankSpec> specs : shapes) {
    std::vector<ChildProcess*> ranks;
    for (RankSpec& s : specs) {
      s.group = absl::StrCat("g", shape);
      s.mode = "matrix";
      ranks.push_back(StartRank(s));
    }
    for (ChildProcess* r : ranks) {
      ASSERT_NE(r, nullptr);
      ASSERT_TRUE(r->WaitForLog("matrix ", absl::Seconds(150))) << r->Log();
      EXPECT_THAT(Line(r->Log(), "matrix "), StartsWith("matrix OK ")) << r->Log();
    }
    ++shape;
  }
  LeaveAll();
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
  // The leaders' rendezvous keys in the job's store went once they were connected.
  EXPECT_THAT(etcd_->Keys(kPrefix), ::testing::Not(::testing::Contains(HasSubstr("commd.span"))));
}

// A call that differs on one rank of one node fails on every rank of every node before any
// data moves, and the group stays usable.
TEST_F(SpanTest, ACallThatDiffersOnOneNodeFailsEverywhereAndTheGroupGoesOn) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "mismatch");
  for (ChildProcess* r : ranks) {
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(r->WaitForLog("after ", absl::Seconds(60))) << r->Log();
    EXPECT_THAT(Line(r->Log(), "mismatch "),
                StartsWith("mismatch INVALID_ARGUMENT all_reduce on group g: the ranks' calls "
                           "differ"))
        << r->Log();
    EXPECT_THAT(Line(r->Log(), "paths "),
                StartsWith("paths INVALID_ARGUMENT all_reduce on group g: the ranks' calls differ"))
        << r->Log();
    EXPECT_EQ(Line(r->Log(), "after "), "after OK ") << r->Log();
  }
}

// NaN on global rank 1 (node-a's second rank) under policy FAIL: every rank of both nodes
// fails with DATA_LOSS naming global rank 1; the next clean call succeeds.
TEST_F(SpanTest, NanOnOneNodeFailsEveryRankUnderPolicyFail) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  // node-a holds global ranks 0 and 1.
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "nan");
  for (ChildProcess* r : ranks) {
    ASSERT_NE(r, nullptr);
    ASSERT_TRUE(r->WaitForLog("clean ", absl::Seconds(60))) << r->Log();
    EXPECT_THAT(Line(r->Log(), "nan "),
                StartsWith("nan DATA_LOSS all_reduce seq 1: NaN/Inf in the input of 1 rank(s), "
                           "the first rank 1 (1 value(s) over the group"))
        << r->Log();
    EXPECT_EQ(Line(r->Log(), "clean "), "clean OK ") << r->Log();
  }
}

// node-b's ranks stop calling: node-a's leader waits on it between the nodes (to connect, or
// inside an exchange once connected), its other rank at the node's barrier. An abort of the
// group on node-a ends both within about a second.
TEST_F(SpanTest, AnAbortEndsACallBlockedOnAnotherNode) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  for (const std::string mode : {"hang-first", "hang"}) {
    SCOPED_TRACE(mode);
    const std::vector<ChildProcess*> ranks = TwoByTwo(n, mode, mode);
    for (ChildProcess* r : ranks) {
      ASSERT_NE(r, nullptr);
      ASSERT_TRUE(r->WaitForLog("joined", absl::Seconds(60)));
      if (mode == "hang") {
        ASSERT_TRUE(r->WaitForLog("first ", absl::Seconds(60))) << r->Log();
        EXPECT_EQ(Line(r->Log(), "first "), "first OK ");
      }
    }
    absl::SleepFor(absl::Seconds(1));  // both of node-a's ranks are inside the all-reduce
    if (mode == "hang") {
      // Every node's view of the job names who holds the group back.
      std::string said;
      EXPECT_TRUE(Eventually([&] {
        auto r = RunProcess({COMMCTL_BINARY, "--runtime-dir", n[0]->runtime_dir(), "health",
                             "--cluster", "--job", "job"});
        said = r.output;
        return absl::StrContains(said,
                                 "group hang: global ranks 2-3 on node-b never "
                                 "entered collective ");
      })) << said;
      EXPECT_THAT(said, HasSubstr(" that global ranks 0-1 wait in (2 of 4 ranks entered it)"))
          << said;
      std::cerr << said;
    }
    auto client = Connect(*n[0]);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Abort(mode, "stop the test's hang").ok());
    for (int g = 0; g < 2; ++g) {
      ASSERT_TRUE(ranks[g]->WaitForLog("hang ", absl::Seconds(20))) << ranks[g]->Log();
      const std::string line = Line(ranks[g]->Log(), "hang ");
      EXPECT_THAT(line, StartsWith("hang ABORTED ")) << line;
      EXPECT_THAT(line, HasSubstr("stop the test's hang")) << line;
      std::cerr << mode << ", global rank " << g << ": " << line << "\n";
    }
  }
}

// One dump of the job covers every global rank of a spanning group: asked on node-a, both
// nodes dump under one id, `commctl fr collect` gathers the 4 files, `commctl fr export` makes
// torchfrtrace's files, and torchfrtrace names the global rank (on node-b) that skipped the
// fifth all-reduce.
TEST_F(SpanTest, OneDumpCoversEveryGlobalRankAndTorchfrtraceNamesTheSkipper) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "skip");
  for (int g = 0; g < 4; ++g) {
    ASSERT_NE(ranks[g], nullptr);
    ASSERT_TRUE(ranks[g]->WaitForLog(g == 3 ? "ran 3" : "ran 4", absl::Seconds(60)))
        << ranks[g]->Log();
  }
  absl::SleepFor(absl::Seconds(1));  // the others are inside the fifth all-reduce
  const ProcessResult dump =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", n[0]->runtime_dir(), "dump", "--job", "job"});
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  std::string id;
  for (absl::string_view line : absl::StrSplit(dump.output, '\n')) {
    if (absl::StrContains(line, "-request-node-a")) {
      for (absl::string_view word : absl::StrSplit(line, absl::ByAnyChar(" /"))) {
        if (absl::EndsWith(word, "-request-node-a")) id = std::string(word);
      }
    }
  }
  ASSERT_FALSE(id.empty()) << dump.output;
  ExpectTorchfrtraceNamesTheMissingRank(n, id, "missing ranks: {3}");
  // The waiting ranks go at once rather than at their wait limit.
  for (DaemonProcess* node : n) {
    auto client = Connect(*node);
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(client->Abort("g", "the test is done").ok());
  }
}

// Each node's job dumps: the directories of job "job" beside its runtime dir.
std::vector<std::string> JobDumpIds(const DaemonProcess& d) {
  std::vector<std::string> ids;
  std::error_code ec;
  const auto dir = std::filesystem::path(d.runtime_dir()).parent_path() / "state" / "dumps" / "job";
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ids.push_back(it->path().filename().string());
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The text of every rank's JSON file of dump `id` of job "job" on node `d`.
std::vector<std::string> DumpFiles(const DaemonProcess& d, const std::string& id) {
  std::vector<std::string> files;
  std::error_code ec;
  const auto dir =
      std::filesystem::path(d.runtime_dir()).parent_path() / "state" / "dumps" / "job" / id;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file() || it->path().extension() != ".json") continue;
    std::ifstream in(it->path());
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return files;
}

// What the watchdogs of this hang say across the job (format/job_diagnosis.h).
constexpr char kSkipSentence[] =
    "group g: global rank 3 on node-b never entered collective 5 that global ranks 0-2 wait in "
    "(3 of 4 ranks entered it)";

// A hang on a group spanning nodes that both nodes' watchdogs find (node-b: global rank 3
// never entered the fifth all-reduce; node-a: its ranks entered it and did not finish) makes
// one dump of the job, under one id both derive from the group and the collective, not one
// per node. The finding reads every node's view of the group: the dump on both nodes, the log
// line and `commctl health` on node-a name global rank 3 on node-b as what holds the group
// back, and the ranks that wait for it. The dump, gathered with `commctl fr collect`, exported
// and read by torchfrtrace, names global rank 3 as missing from the collective: hang, dump,
// collect and diagnosis end to end, with no request from anyone.
TEST_F(SpanTest, AHangBothNodesFindIsDumpedOnceUnderOneId) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n, "watchdog { poll_interval_ms: 100 }\n");
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "skip", "g", /*timeout_ms=*/2000);
  for (ChildProcess* r : ranks)
    ASSERT_TRUE(r != nullptr && r->WaitForLog("ran ", absl::Seconds(60)));
  // Both watchdogs find it (each logs its finding); then a few polls more for any second dump.
  EXPECT_TRUE(Eventually([&] {
    return absl::StrContains(n[0]->Log(), "job/g: stuck") &&
           absl::StrContains(n[1]->Log(), "job/g: lagging");
  })) << n[0]->Log()
      << n[1]->Log();
  absl::SleepFor(absl::Seconds(2));
  // The hang's dumps only: once the 2 s timeout passes, the waiting leader's exchange fails
  // and it has the group aborted, a dump of its own (trigger abort, announced to the job).
  auto hangs = [](std::vector<std::string> ids) {
    std::erase_if(ids, [](const std::string& id) { return !absl::StartsWith(id, "hang-"); });
    return ids;
  };
  const std::vector<std::string> a = hangs(JobDumpIds(*n[0])), b = hangs(JobDumpIds(*n[1]));
  ASSERT_EQ(a.size(), 1u) << absl::StrJoin(JobDumpIds(*n[0]), " ");
  EXPECT_EQ(a, b);
  EXPECT_THAT(a[0], ::testing::MatchesRegex("hang-g-f[0-9]+-s5"));
  std::vector<std::string> announced = etcd_->Keys(absl::StrCat(kPrefix, "/dumps/"));
  std::erase_if(announced, [](const std::string& k) { return !absl::StrContains(k, "/hang-"); });
  EXPECT_THAT(announced, ::testing::ElementsAre(absl::StrCat(kPrefix, "/dumps/0/job/", a[0])));
  // Announced once: the second finder's announcement found the key there and wrote nothing.
  EXPECT_EQ(etcd_->Version(announced[0]), 1);
  // Each node's dump holds its two ranks, each with the job-wide sentence in its diagnosis.
  for (DaemonProcess* node : n) {
    const std::vector<std::string> files = DumpFiles(*node, a[0]);
    EXPECT_EQ(files.size(), 2u) << node->runtime_dir();
    for (const std::string& f : files) {
      EXPECT_THAT(f, HasSubstr(absl::StrCat("\"job_summary\":\"", kSkipSentence, "\"")));
    }
  }
  EXPECT_THAT(n[0]->Log(), HasSubstr(absl::StrCat("; job-wide: ", kSkipSentence)));
  // The watchdog's dump gathered from both nodes, exported, and read by torchfrtrace: it names
  // the global rank that never entered the collective.
  ExpectTorchfrtraceNamesTheMissingRank(n, a[0], "missing ranks: {3}");
  const ProcessResult health =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", n[0]->runtime_dir(), "health"});
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr(absl::StrCat("; job-wide: ", kSkipSentence)))
      << health.output;
  std::cerr << health.output;
  // The views both nodes publish carry it too: node-b reads node-a's (and its own) from etcd.
  std::string cluster;
  EXPECT_TRUE(Eventually([&] {
    cluster = RunProcess({COMMCTL_BINARY, "--runtime-dir", n[1]->runtime_dir(), "health",
                          "--cluster", "--job", "job"})
                  .output;
    int rows = 0;
    for (absl::string_view line : absl::StrSplit(cluster, '\n')) {
      if (absl::StrContains(line, absl::StrCat("; job-wide: ", kSkipSentence))) ++rows;
    }
    return rows == 2;
  })) << cluster;
  std::cerr << cluster;
  for (DaemonProcess* node : n) {
    auto client = Connect(*node);
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(client->Abort("g", "the test is done").ok());
  }
}

// With etcd gone, a hang on a spanning group is still dumped on the node that finds it, at
// once, with its own diagnosis and a job-wide summary that says the nodes' views could not be
// read.
TEST_F(SpanTest, WithEtcdGoneAHangIsDumpedWithThisNodesDiagnosisSayingSo) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n, "watchdog { poll_interval_ms: 100 }\n");
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "skip", "g", /*timeout_ms=*/2000);
  for (ChildProcess* r : ranks)
    ASSERT_TRUE(r != nullptr && r->WaitForLog("ran ", absl::Seconds(60)));
  etcd_->Kill();
  EXPECT_TRUE(Eventually([&] { return absl::StrContains(n[0]->Log(), "job/g: stuck"); }))
      << n[0]->Log();
  std::vector<std::string> a;
  EXPECT_TRUE(Eventually([&] {
    a = JobDumpIds(*n[0]);
    return a.size() == 1 && DumpFiles(*n[0], a[0]).size() == 2;
  }));
  ASSERT_EQ(a.size(), 1u) << absl::StrJoin(a, " ");
  EXPECT_THAT(a[0], ::testing::MatchesRegex("hang-g-f[0-9]+-s5"));
  for (const std::string& f : DumpFiles(*n[0], a[0])) {
    EXPECT_THAT(f, HasSubstr("\"job_summary\":\"other nodes' views unavailable: ")) << f;
    EXPECT_THAT(f, HasSubstr("this diagnosis is node node-a's alone")) << f;
    EXPECT_THAT(f, HasSubstr("\"summary\":\"group g: ")) << f;
  }
  EXPECT_THAT(n[0]->Log(), HasSubstr("; job-wide: other nodes' views unavailable: "));
  const ProcessResult health =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", n[0]->runtime_dir(), "health"});
  EXPECT_THAT(health.output, HasSubstr("; job-wide: other nodes' views unavailable: "))
      << health.output;
  std::cerr << health.output;
  for (DaemonProcess* node : n) {
    auto client = Connect(*node);
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(client->Abort("g", "the test is done").ok());
  }
  ASSERT_EQ(etcd_->Start(), absl::OkStatus());  // the ranks' leave goes through it
}

// With etcd slow to answer (paused: the cluster still counts itself connected for a while),
// the finding waits for the nodes' views no longer than its bound, then dumps with this node's
// diagnosis, saying that etcd did not answer in time.
TEST_F(SpanTest, WithEtcdSlowAHangIsDumpedAtTheEndOfItsWait) {
  std::vector<DaemonProcess*> n;
  // A keep-alive waits for etcd at most a third of the lease's TTL: 9 s makes it
  // call_timeout_ms (2 s), which the finding below comes well before.
  lease_ttl_ms_ = "9000";
  StartNodes({"node-a", "node-b"}, &n, "watchdog { poll_interval_ms: 100 }\n");
  if (HasFatalFailure()) return;
  // A short timeout: the finding comes well before the paused etcd costs the cluster its
  // connection (a keep-alive unanswered for call_timeout_ms, 2 s).
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "skip", "g", /*timeout_ms=*/1000);
  for (ChildProcess* r : ranks)
    ASSERT_TRUE(r != nullptr && r->WaitForLog("ran ", absl::Seconds(60)));
  etcd_->Pause(true);
  std::vector<std::string> a;
  EXPECT_TRUE(Eventually([&] {
    a = JobDumpIds(*n[0]);
    return a.size() == 1 && DumpFiles(*n[0], a[0]).size() == 2;
  }));
  etcd_->Pause(false);
  ASSERT_EQ(a.size(), 1u) << absl::StrJoin(a, " ");
  for (const std::string& f : DumpFiles(*n[0], a[0])) {
    EXPECT_THAT(f,
                HasSubstr("\"job_summary\":\"other nodes' views unavailable: etcd did not answer "
                          "within 300ms; this diagnosis is node node-a's alone\""))
        << f;
  }
  for (DaemonProcess* node : n) {
    auto client = Connect(*node);
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(client->Abort("g", "the test is done").ok());
  }
}

}  // namespace
}  // namespace commd::testing
