// An abort across nodes (docs/cluster.md, "An abort across nodes") against a real etcd on
// loopback, real daemons as nodes and real rank processes (span_rank): an abort on one node
// reaches the group's ranks on the other (its latency printed), only for the same formation and
// uid; a node cut off from etcd still aborts its own ranks; every bad key or value in etcd is
// skipped naming what is wrong; a node whose own lease is lost aborts its part naming it; and
// what `commctl groups` shows of a spanning group.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commd/commd.h"
#include "commd/v1/groups.pb.h"
#include "commd/v1/health.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/span_fixture.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSent[] = "commd_cluster_span_aborts_total{event=\"sent\"}";
constexpr char kSendFailed[] = "commd_cluster_span_aborts_total{event=\"send_failed\"}";
constexpr char kReceived[] = "commd_cluster_span_aborts_total{event=\"received\"}";
constexpr char kApplied[] = "commd_cluster_span_aborts_total{event=\"applied\"}";
constexpr char kRejected[] = "commd_cluster_span_aborts_total{event=\"rejected\"}";

class SpanAbortTest : public SpanFixture {
 protected:
  // `per_node` ranks of group `group` on each node of `nodes`, global ranks interleaved (node i's
  // local rank r is global rank r * nodes + i), every one joined; by node, then local rank.
  std::vector<ChildProcess*> Form(const std::vector<DaemonProcess*>& nodes, int per_node,
                                  const std::string& group = "g", bool as_nobody = false) {
    std::vector<ChildProcess*> ranks;
    const int global_world = per_node * static_cast<int>(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (int r = 0; r < per_node; ++r) {
        ranks.push_back(
            StartRank({.node = nodes[i],
                       .rank = r,
                       .world = per_node,
                       .global_rank = r * static_cast<int>(nodes.size()) + static_cast<int>(i),
                       .global_world = global_world,
                       .group = group,
                       .as_nobody = as_nobody}));
      }
    }
    for (ChildProcess* r : ranks) {
      EXPECT_NE(r, nullptr);
      if (r != nullptr) EXPECT_TRUE(r->WaitForLog("joined", absl::Seconds(90))) << r->Log();
    }
    return ranks;
  }
  // The group `group` of job "job" of `uid` as node `d` lists it.
  v1::GroupInfo Info(const DaemonProcess& d, const std::string& group, uint32_t uid = 0) {
    auto client = Connect(d);
    if (client == nullptr) return {};
    auto listed = client->ListGroups();
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return {};
    for (const v1::GroupInfo& g : listed->groups()) {
      if (g.uid() == uid && g.job_id() == "job" && g.name() == group) return g;
    }
    ADD_FAILURE() << "no group " << group << " of uid " << uid << " on " << d.runtime_dir();
    return {};
  }
  static std::string AbortKey(uint32_t uid, const std::string& group, uint64_t formation) {
    return absl::StrCat(kPrefix, "/aborts/", uid, "/job/", group, "/", formation);
  }
  static std::string AbortValue(const std::string& node, const std::string& reason,
                                const std::string& text) {
    v1::SpanAbort value;
    value.set_node(node);
    value.set_reason(reason);
    value.set_text(text);
    return value.SerializeAsString();
  }
  // Nobody printed "aborted ".
  static bool NoneAborted(const std::vector<ChildProcess*>& ranks) {
    for (ChildProcess* r : ranks) {
      if (absl::StrContains(r->Log(), "aborted ")) return false;
    }
    return true;
  }
  static int64_t SeenUs(const ChildProcess& r) {
    int64_t us = 0;
    const std::string line = Line(r.Log(), "abort_seen_unix_us ");
    return absl::SimpleAtoi(line.substr(line.find(' ') + 1), &us) ? us : -1;
  }
};

// commctl abort's path (Client::Abort) on node-a: node-b's ranks see the abort naming node-a,
// within about a second; nothing echoes back; the key goes with its own lease.
TEST_F(SpanAbortTest, AnAbortOnOneNodeAbortsTheGroupOnEveryNodeNamingIt) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = Form(n, 2);
  if (HasFailure()) return;

  // What ListGroups and commctl groups show of the group's global shape.
  const v1::GroupInfo a = Info(*n[0], "g");
  const v1::GroupInfo b = Info(*n[1], "g");
  EXPECT_EQ(a.global_world_size(), 4);
  EXPECT_EQ(a.node_count(), 2);
  EXPECT_EQ(a.node_index(), 0);
  EXPECT_EQ(b.node_index(), 1);
  EXPECT_GT(a.formation(), 0u);
  EXPECT_EQ(a.formation(), b.formation());
  const ProcessResult listed =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", n[1]->runtime_dir(), "--job", "job", "groups"});
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr(" GLOBAL ")) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("4 over 2 nodes (this is node 1)")) << listed.output;

  auto client = Connect(*n[0]);
  ASSERT_NE(client, nullptr);
  const absl::Time asked = absl::Now();
  ASSERT_TRUE(client->Abort("g", "operator stop").ok());
  for (size_t i = 0; i < ranks.size(); ++i) {
    ASSERT_TRUE(ranks[i]->WaitForLog("abort_seen_unix_us ", absl::Seconds(10))) << ranks[i]->Log();
    const std::string line = Line(ranks[i]->Log(), "aborted ");
    EXPECT_THAT(line, HasSubstr("operator stop")) << line;
    if (i < 2) {
      EXPECT_THAT(line, Not(HasSubstr("aborted on node"))) << line;
      continue;
    }
    EXPECT_THAT(line, HasSubstr("aborted on request: aborted on node node-a: uid 0 ")) << line;
    std::cerr << "abort across nodes: node-a's Abort call to node-b's local rank " << i - 2
              << " seeing it: " << (SeenUs(*ranks[i]) - absl::ToUnixMicros(asked)) / 1000.0
              << " ms\n";
  }
  // node-b's view names where the abort came from.
  auto remote = Connect(*n[1]);
  ASSERT_NE(remote, nullptr);
  auto health = remote->GetHealth("g");
  ASSERT_TRUE(health.ok()) << health.status();
  ASSERT_EQ(health->groups_size(), 1);
  EXPECT_EQ(health->groups(0).state(), v1::ABORTED);
  EXPECT_EQ(health->groups(0).abort_reason(), "admin");
  EXPECT_EQ(health->groups(0).aborted_on_node(), "node-a");
  const ProcessResult shown =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", n[1]->runtime_dir(), "--job", "job", "health"});
  EXPECT_THAT(shown.output, HasSubstr("[aborted on request, on node node-a]")) << shown.output;

  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[0], kSent) == 1; }));
  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[1], kApplied) == 1; }));
  absl::SleepFor(absl::Milliseconds(500));  // an echo would have come back by now
  EXPECT_EQ(MetricValue(*n[1], kReceived), 1);
  EXPECT_EQ(MetricValue(*n[1], kSent), 0);
  EXPECT_EQ(MetricValue(*n[0], kReceived), 0);
  EXPECT_EQ(MetricValue(*n[0], kSendFailed), 0);
  const std::string key = AbortKey(0, "g", a.formation());
  EXPECT_EQ(etcd_->Keys(absl::StrCat(kPrefix, "/aborts/")), std::vector<std::string>{key});
  EXPECT_EQ(etcd_->LeaseTtl(key), 60);  // gone within a minute: keys do not pile up
  LeaveAll();
  EXPECT_TRUE(Eventually([&] { return NothingLeft(); }));
}

// An announcement names one formation: a group formed again under the same name is not hit by
// the earlier formation's announcement (late, or replayed), only by its own.
TEST_F(SpanAbortTest, ALaterFormationIsNotAbortedByAnEarlierOnesAnnouncement) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  Form(n, 1);
  const uint64_t first = Info(*n[0], "g").formation();
  LeaveAll();
  ASSERT_TRUE(Eventually([&] { return NothingLeft(); }));
  std::filesystem::remove(LeaveFile());
  ranks_.clear();
  const std::vector<ChildProcess*> ranks = Form(n, 1);
  if (HasFailure()) return;
  const uint64_t second = Info(*n[0], "g").formation();
  EXPECT_GT(second, first);

  ASSERT_TRUE(etcd_->Put(AbortKey(0, "g", first), AbortValue("node-c", "admin", "stale")).ok());
  EXPECT_TRUE(Eventually(
      [&] { return MetricValue(*n[0], kReceived) == 1 && MetricValue(*n[1], kReceived) == 1; }));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(NoneAborted(ranks));
  EXPECT_EQ(MetricValue(*n[0], kApplied), 0);

  ASSERT_TRUE(
      etcd_->Put(AbortKey(0, "g", second), AbortValue("node-c", "stuck", "seq 3 stuck")).ok());
  for (ChildProcess* r : ranks) {
    ASSERT_TRUE(r->WaitForLog("aborted ", absl::Seconds(10))) << r->Log();
    EXPECT_THAT(Line(r->Log(), "aborted "),
                HasSubstr("by the watchdog (a collective is stuck: started on every rank, not "
                          "completed in time): aborted on node node-c: seq 3 stuck"));
  }
  // The test's own keys (no lease) are all there is: the daemons wrote none.
  EXPECT_EQ(etcd_->Keys(absl::StrCat(kPrefix, "/aborts/")).size(), 2u);
}

// Another uid's group of the same job and group name: a uid's abort, or an announcement naming
// its formation under another uid, never reaches it.
TEST_F(SpanAbortTest, AnotherUidsGroupOfTheSameNameIsUntouched) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run ranks as another uid (setpriv)";
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> mine = Form(n, 1);
  const std::vector<ChildProcess*> theirs = Form(n, 1, "g", /*as_nobody=*/true);
  if (HasFailure()) return;
  const uint64_t their_formation = Info(*n[0], "g", 65534).formation();
  ASSERT_NE(their_formation, Info(*n[0], "g").formation());

  // Their formation under uid 0: no uid 0 group has it.
  ASSERT_TRUE(
      etcd_->Put(AbortKey(0, "g", their_formation), AbortValue("node-c", "admin", "x")).ok());
  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[1], kReceived) == 1; }));
  // uid 0 aborts its own group on node-a: node-b aborts uid 0's ranks only.
  auto client = Connect(*n[0]);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Abort("g", "mine only").ok());
  ASSERT_TRUE(mine[1]->WaitForLog("aborted ", absl::Seconds(10))) << mine[1]->Log();
  EXPECT_THAT(Line(mine[1]->Log(), "aborted "), HasSubstr("aborted on node node-a:"));
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(NoneAborted(theirs));
  EXPECT_EQ(MetricValue(*n[1], kApplied), 1);
}

// etcd gone: the abort still stops this node's ranks, and says it was not announced. An etcd
// outage past the lease's TTL (2 s here) is not a lost lease: the other node's part goes on.
// ... until etcd answers again: then the announcement is sent, node-b's rank is aborted naming
// node-a, and node-a's view of the group (aborted while etcd was away) is written.
TEST_F(SpanAbortTest, WithoutEtcdTheAbortIsLocalUntilEtcdAnswersAgain) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = Form(n, 1);
  if (HasFailure()) return;
  const uint64_t formation = Info(*n[0], "g").formation();
  etcd_->Kill();
  auto client = Connect(*n[0]);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Abort("g", "etcd is gone").ok());
  ASSERT_TRUE(ranks[0]->WaitForLog("aborted ", absl::Seconds(10))) << ranks[0]->Log();
  EXPECT_THAT(Line(ranks[0]->Log(), "aborted "), HasSubstr("etcd is gone"));
  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[0], kSendFailed) == 1; }));
  EXPECT_THAT(n[0]->Log(),
              HasSubstr(absl::StrCat("the abort of group g (job job, formation ", formation,
                                     ") was not announced to its other nodes: ")));
  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[1], "commd_cluster_connected") == 0; }));
  EXPECT_EQ(MetricValue(*n[0], "commd_cluster_span_aborts_pending"), 1);
  absl::SleepFor(absl::Seconds(3));
  EXPECT_TRUE(NoneAborted({ranks[1]})) << ranks[1]->Log();
  EXPECT_EQ(MetricValue(*n[1], kSent), 0);

  ASSERT_EQ(etcd_->Start(), absl::OkStatus());  // same data dir and port: the nodes' leases live on
  ASSERT_TRUE(ranks[1]->WaitForLog("aborted ", absl::Seconds(30))) << ranks[1]->Log();
  EXPECT_THAT(Line(ranks[1]->Log(), "aborted "), HasSubstr("aborted on node node-a"));
  EXPECT_THAT(Line(ranks[1]->Log(), "aborted "), HasSubstr("etcd is gone"));
  EXPECT_TRUE(Eventually([&] { return MetricValue(*n[0], kSent) == 1; }));
  EXPECT_EQ(MetricValue(*n[0], "commd_cluster_span_aborts_pending"), 0);
  EXPECT_THAT(n[0]->Log(), HasSubstr("again, now that etcd answers"));
  v1::NodeGroupView view;
  EXPECT_TRUE(Eventually([&] {
    std::string value = etcd_->Get(absl::StrCat(kPrefix, "/progress/0/job/g/node-a"));
    if (!value.empty() && value.back() == '\n') value.pop_back();  // etcdctl's
    return view.ParseFromString(value) && view.health().state() == v1::ABORTED;
  })) << view.DebugString();
}

// A process that takes node-b's place in the leaders' gloo rendezvous (it can write the job's
// store, as only the job's uid can) but sends the wrong token over the connection: node-a's
// leader refuses it naming node-b before any data is exchanged and has the group aborted on
// both nodes; no rank's buffer holds anything but its own input.
TEST_F(SpanAbortTest, AConnectionThatCannotProveItsNodeIsRefusedBeforeAnyData) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = TwoByTwo(n, "late");
  for (ChildProcess* r : ranks) {
    ASSERT_TRUE(r->WaitForLog("joined", absl::Seconds(90))) << r->Log();
  }
  const uint64_t formation = Info(*n[0], "g").formation();
  ASSERT_GT(formation, 0u);
  // node-b is node index 1 (nodes sort by name); lane 0 is the leaders'.
  auto impostor =
      ChildProcess::Start({GLOO_IMPOSTOR, "g", absl::StrCat(formation), "2", "1", "0"},
                          {"COMMD_RUNTIME_DIR=" + n[1]->runtime_dir(), "COMMD_JOB_ID=job"});
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  for (int g : {0, 1}) {
    ASSERT_TRUE(ranks[g]->WaitForLog("late ", absl::Seconds(60))) << ranks[g]->Log();
    const std::string line = Line(ranks[g]->Log(), "late ");
    // The leader's check failed UNAVAILABLE and asked the daemon to abort the group, which it
    // did before either rank read the outcome: both report the abort, naming why.
    EXPECT_THAT(line, HasSubstr(absl::StrCat("late ABORTED ", g + 1, " ")));
    EXPECT_THAT(line, HasSubstr("the connection from node node-b (lane 0) did not prove it is "
                                "that node's rank"));
  }
  EXPECT_TRUE((*impostor)->WaitForLog("impostor connected", absl::Seconds(10)))
      << (*impostor)->Log();
  // node-a asked for the abort: node-b's ranks, let go now, find their group aborted.
  std::ofstream(LeaveFile() + ".go").put('x');
  for (int g : {2, 3}) {
    ASSERT_TRUE(ranks[g]->WaitForLog("late ", absl::Seconds(60))) << ranks[g]->Log();
    EXPECT_THAT(Line(ranks[g]->Log(), "late "), HasSubstr(absl::StrCat("late ABORTED ", g + 1)));
  }
}

// Every key or value under <prefix>/aborts/ that is not what commd writes is skipped with the
// offending value named; the daemons go on, and a valid announcement after them still works.
TEST_F(SpanAbortTest, BadAnnouncementsAreSkippedNamingWhatIsWrong) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = Form(n, 1);
  if (HasFailure()) return;
  const uint64_t f = Info(*n[0], "g").formation();
  const std::string good = AbortValue("node-c", "admin", "bad input");
  const std::string root = absl::StrCat(kPrefix, "/aborts/");
  const std::string huge = AbortValue("node-c", "admin", std::string(5000, 'x'));
  struct Bad {
    std::string key, value, said;
  };
  const std::vector<Bad> bad = {
      {root + absl::StrCat("x1/job/g/", f), good,
       "uid \"x1\" is not a decimal number from 0 to 4294967295"},
      {root + absl::StrCat("00/job/g/", f), good, "uid \"00\" is not a decimal number"},
      {root + absl::StrCat("0/job!/g/", f), good, "job id \"job!\" is invalid: character '!'"},
      {root + absl::StrCat("0/job/g%2/", f), good, "group name \"g%2\" is invalid: character '%'"},
      {root + "0/job/g/0", good, "formation \"0\" is not a decimal number from 1 to"},
      {root + "0/job/g/+7", good, "formation \"+7\" is not a decimal number"},
      {root + absl::StrCat("0/job/g/", f, "/x"), good,
       "5 part(s) after " + root + "; allowed 4: <uid>/<job>/<group>/<formation>"},
      {AbortKey(0, "g", f), "\x0a\x7f", "is not a commd.v1.SpanAbort"},
      {AbortKey(0, "g", f), huge,
       absl::StrCat("abort announcement of ", huge.size(), " bytes; allowed at most 4096")},
      {AbortKey(0, "g", f), AbortValue("no de", "admin", "x"),
       "abort announcement names node \"no de\"; allowed 1 to 128 of letters"},
      {AbortKey(0, "g", f), AbortValue("node-c", "bogus", "x"),
       "abort announcement gives reason \"bogus\"; allowed one of admin, stuck"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(bad[i].said);
    ASSERT_TRUE(etcd_->Put(bad[i].key, bad[i].value).ok());
    EXPECT_TRUE(Eventually([&] {
      return MetricValue(*n[0], kRejected) == static_cast<double>(i + 1) &&
             MetricValue(*n[1], kRejected) == static_cast<double>(i + 1);
    }));
    EXPECT_THAT(n[1]->Log(), HasSubstr(bad[i].said));
  }
  EXPECT_TRUE(NoneAborted(ranks));
  EXPECT_EQ(MetricValue(*n[0], kReceived), 0);
  ASSERT_TRUE(etcd_->Put(AbortKey(0, "g", f), good).ok());
  for (ChildProcess* r : ranks) {
    ASSERT_TRUE(r->WaitForLog("aborted ", absl::Seconds(10))) << r->Log();
    EXPECT_THAT(Line(r->Log(), "aborted "), HasSubstr("aborted on node node-c: bad input"));
  }
  // What is there is what the test wrote: the daemons added nothing for bad input.
  std::set<std::string> written;
  for (const Bad& b : bad) written.insert(b.key);
  const std::vector<std::string> keys = etcd_->Keys(root);
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()), written);
  for (const std::string& k : written) etcd_->Delete(k);
  LeaveAll();
  EXPECT_TRUE(Eventually([&] { return NothingLeft() && etcd_->Keys(root).empty(); }));
}

// Announcements made before a node watched (it was not running, or cut off at its start) are
// heard when its watch first opens: listed, parsed as the watched ones are, and applied to the
// formations this node holds (none here, so nothing is aborted).
TEST_F(SpanAbortTest, AnnouncementsMadeBeforeANodeWatchedAreHeardWhenItStarts) {
  const std::string root = absl::StrCat(kPrefix, "/aborts/");
  ASSERT_EQ(etcd_->Start(), absl::OkStatus());
  ASSERT_TRUE(etcd_->Put(AbortKey(0, "g", 7), AbortValue("node-c", "admin", "before")).ok());
  ASSERT_TRUE(etcd_->Put(root + "x1/job/g/7", AbortValue("node-c", "admin", "bad")).ok());
  etcd_->Kill();  // StartNodes starts it again, with its data
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  for (DaemonProcess* d : n) {
    EXPECT_TRUE(Eventually([&] {
      return MetricValue(*d, kReceived) == 1 && MetricValue(*d, kRejected) == 1;
    })) << d->Log();
    EXPECT_EQ(MetricValue(*d, kApplied), 0);
    EXPECT_THAT(d->Log(), HasSubstr("uid \"x1\" is not a decimal number"));
  }
  etcd_->Delete(AbortKey(0, "g", 7));
  etcd_->Delete(root + "x1/job/g/7");
}

// This node's own lease lost (revoked here, as etcd does when it expires): the other node
// aborts its part for the lost node, and this node aborts its own, naming why; neither
// announces it (each sees the loss).
TEST_F(SpanAbortTest, ThisNodesLostLeaseAbortsItsPartNamingIt) {
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = Form(n, 1);
  if (HasFailure()) return;
  auto client = Connect(*n[0]);
  ASSERT_NE(client, nullptr);
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  const ProcessResult revoke =
      RunProcess({kEtcdctl, "--endpoints", etcd_->endpoint(), "lease", "revoke",
                  absl::StrFormat("%x", status->cluster().lease_id())},
                 absl::Seconds(30), {"ETCDCTL_API=3"});
  ASSERT_EQ(revoke.exit_code, 0) << revoke.output;
  ASSERT_TRUE(ranks[0]->WaitForLog("aborted ", absl::Seconds(30))) << ranks[0]->Log();
  EXPECT_THAT(Line(ranks[0]->Log(), "aborted "),
              HasSubstr("group g: this node (node-a) lost its lease in etcd (etcd at " +
                        etcd_->endpoint() + " no longer has it"));
  ASSERT_TRUE(ranks[1]->WaitForLog("aborted ", absl::Seconds(30))) << ranks[1]->Log();
  EXPECT_THAT(Line(ranks[1]->Log(), "aborted "),
              HasSubstr("node node-a (global rank(s) [0]) is gone"));
  auto health = client->GetHealth("g");
  ASSERT_TRUE(health.ok()) << health.status();
  ASSERT_EQ(health->groups_size(), 1);
  EXPECT_EQ(health->groups(0).state(), v1::ABORTED);
  EXPECT_EQ(health->groups(0).last_diagnosis().kind(), v1::DEAD);
  EXPECT_THAT(health->groups(0).last_diagnosis().summary(), HasSubstr("lost its lease"));
  // node-a registers again, on a new lease.
  EXPECT_TRUE(
      Eventually([&] { return !etcd_->Keys(absl::StrCat(kPrefix, "/nodes/node-a")).empty(); }));
  EXPECT_EQ(MetricValue(*n[0], kSent), 0);
  EXPECT_EQ(MetricValue(*n[1], kSent), 0);
}

}  // namespace
}  // namespace commd::testing
