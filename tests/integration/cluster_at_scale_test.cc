// The cluster against what breaks it on the way to hundreds of nodes, with a real etcd on
// loopback and real daemons as nodes: a compaction that cancels a watch while its node was cut
// off, a half-open connection to etcd, a daemon restarted within its lease's TTL, many writers
// of one uid's store at once, and a three-member etcd losing its leader and then its quorum. Node A
// reaches etcd through a TcpProxy the test cuts or silences; the others connect directly. After a
// break, a watch must go on delivering: a node that comes afterwards must appear in node A's view,
// and a node that went must be told gone.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/tcp_proxy.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kPrefix[] = "/commd-watch-test";

int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

class ClusterAtScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kEtcd, X_OK) != 0) {
      GTEST_SKIP() << kEtcd << " is missing: install Debian's etcd-server (scripts/install-deps)";
    }
    etcd_ = std::make_unique<Etcd>(tmp_.Join("etcd"));
    ASSERT_EQ(etcd_->Start(), absl::OkStatus());
    proxy_ = std::make_unique<TcpProxy>(PortOf(etcd_->endpoint()));
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& [name, d] : daemons_) {
        if (d != nullptr) std::cerr << "--- daemon " << name << ":\n" << d->Log();
      }
    }
    daemons_.clear();
    proxy_.reset();
    if (etcd_ != nullptr) etcd_->Kill();
  }

  // (Re)starts the daemon of node `node` on its own runtime dir (the same one each time, so a
  // restart is the same daemon's), reaching etcd at `endpoints`; `in_cluster` goes inside its
  // cluster section.
  DaemonProcess* StartNode(const std::string& node, const std::vector<std::string>& endpoints,
                           const std::string& in_cluster = "lease_ttl_ms: 2000\n") {
    std::unique_ptr<TempDir>& dir = dirs_[node];
    if (dir == nullptr) {
      dir = std::make_unique<TempDir>("commd-node");
      ::chmod(dir->path().c_str(), 0755);
    }
    std::string config = "socket_group: \"nogroup\"\ncluster {\n";
    for (const std::string& e : endpoints)
      absl::StrAppend(&config, "  etcd_endpoints: \"", e, "\"\n");
    absl::StrAppend(&config, "  node_name: \"", node, "\"\n  prefix: \"", kPrefix,
                    "\"\n  call_timeout_ms: 2000\n  retry_initial_ms: 50\n  retry_max_ms: 400\n",
                    in_cluster, "}\n");
    auto d = StartDaemonWithConfig(*dir, config);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    daemons_[node] = std::move(*d);
    return daemons_[node].get();
  }
  DaemonProcess* StartNode(const std::string& node, const std::string& endpoint,
                           const std::string& in_cluster = "lease_ttl_ms: 2000\n") {
    return StartNode(node, std::vector<std::string>{endpoint}, in_cluster);
  }
  static bool Connected(const DaemonProcess& d) {
    return MetricValue(d, "commd_cluster_connected") == 1;
  }
  // Node `name` as `d` lists it (`commctl --json cluster nodes`); null when not listed.
  static nlohmann::json Listed(const DaemonProcess& d, const std::string& name) {
    const ProcessResult r = RunProcess(
        {COMMCTL_BINARY, "--runtime-dir", d.runtime_dir(), "--json", "cluster", "nodes"});
    const nlohmann::json list = nlohmann::json::parse(r.output, nullptr, false);
    if (r.exit_code != 0 || !list.is_object() || !list.contains("nodes")) return nullptr;
    for (const auto& n : list["nodes"]) {
      if (n["name"] == name) return n;
    }
    return nullptr;
  }
  static bool ListedLive(const DaemonProcess& d, const std::string& name) {
    const nlohmann::json n = Listed(d, name);
    return n.is_object() && n["live"] == true;
  }
  std::string NodeKey(const std::string& node) const {
    return absl::StrCat(kPrefix, "/nodes/", node);
  }

  TempDir tmp_{"commd-watch"};
  std::unique_ptr<Etcd> etcd_;
  std::unique_ptr<TcpProxy> proxy_;
  std::map<std::string, std::unique_ptr<TempDir>> dirs_;
  std::map<std::string, std::unique_ptr<DaemonProcess>> daemons_;
};

// Node A is cut off from etcd while node B dies and etcd's history is compacted past the
// revision A's watches would resume from. When A comes back, A reads the nodes again, finds B
// gone and says so, and watches on, so a node C that comes afterwards appears in A's view.
// Two cases: the compaction past B's deletion (etcd cancels the reopened watch with
// compact_revision; before, the cancelled watch counted as open and delivered nothing again),
// and exactly at it (etcd does not cancel a watch from the compaction's revision, but the
// deletion there is compacted away with no event: A's read at the revision before its resume
// point fails, which tells it).
class CompactionTest : public ClusterAtScaleTest, public ::testing::WithParamInterface<bool> {};

TEST_P(CompactionTest, AWatchThatMissedACompactionReadsAgainAndGoesOn) {
  const bool past_the_deletion = GetParam();
  // A's lease outlives the cut, so that A is the same registration when it comes back.
  DaemonProcess* a = StartNode("node-a", proxy_->endpoint(), "lease_ttl_ms: 20000\n");
  DaemonProcess* b = StartNode("node-b", etcd_->endpoint());
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(Eventually([&] { return ListedLive(*a, "node-b"); }));
  // A's dumps watch must have opened (and so have a revision to resume from) before the cut:
  // a watch that never opened starts from whatever is current when it first does.
  ASSERT_TRUE(Eventually([&] { return MetricValue(*a, "commd_cluster_job_dumps_watching") == 1; }))
      << a->Log();

  proxy_->Cut();
  ASSERT_TRUE(Eventually([&] { return !Connected(*a); })) << a->Log();
  ASSERT_TRUE(b->Stop(SIGKILL).ok());
  ASSERT_TRUE(Eventually([&] { return etcd_->Keys(NodeKey("node-b")).empty(); }));
  if (past_the_deletion) {
    ASSERT_TRUE(etcd_->Put("/elsewhere", "a later revision").ok());
  }
  const absl::StatusOr<int64_t> compacted = etcd_->Compact();
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  proxy_->Resume();

  ASSERT_TRUE(Eventually([&] { return Connected(*a); })) << a->Log();
  EXPECT_TRUE(a->WaitForLog("were compacted before this node saw them; reading every key there",
                            absl::Seconds(30)))
      << a->Log();
  if (past_the_deletion) {
    // The watches that do not read (job dumps, aborts) resume from before the compaction too:
    // etcd cancels them, naming the compaction, and they go on from the oldest revision kept.
    EXPECT_TRUE(
        a->WaitForLog("changes under /commd-watch-test/dumps/ up to revision", absl::Seconds(30)))
        << a->Log();
    EXPECT_THAT(a->Log(), HasSubstr("etcd cancelled the watch: "));
  }
  EXPECT_TRUE(Eventually([&] { return MetricValue(*a, "commd_cluster_job_dumps_watching") == 1; }));
  EXPECT_TRUE(
      a->WaitForLog("node node-b is gone: its commd's lease in etcd ended", absl::Seconds(30)))
      << a->Log();
  EXPECT_TRUE(Eventually([&] {
    const nlohmann::json n = Listed(*a, "node-b");
    return n.is_object() && n["live"] == false;
  }));
  // The watch goes on after the compaction.
  ASSERT_NE(StartNode("node-c", etcd_->endpoint()), nullptr);
  EXPECT_TRUE(Eventually([&] { return ListedLive(*a, "node-c"); })) << a->Log();
}

INSTANTIATE_TEST_SUITE_P(AtAndPastTheDeletion, CompactionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "PastTheDeletion" : "AtTheDeletion";
                         });

// The connection between node A and etcd goes half-open: A's end stays open and silent (no FIN,
// no RST), etcd's end is closed, so etcd drops A's watches. A's pings go unanswered, A closes
// the connection and opens a new one, its watches reopen, and a node C that came meanwhile
// appears in its view. (Before: nothing noticed; the watches and every call stayed on the dead
// connection.)
TEST_F(ClusterAtScaleTest, AHalfOpenConnectionToEtcdIsFoundAndItsWatchesReopen) {
  // Pings every 6 s (etcd refuses them more often than every 5 s), each answered within 2 s.
  DaemonProcess* a =
      StartNode("node-a", proxy_->endpoint(), "lease_ttl_ms: 60000\n  keepalive_ms: 6000\n");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(Eventually([&] { return Connected(*a) && ListedLive(*a, "node-a"); }));

  proxy_->Blackhole();
  ASSERT_NE(StartNode("node-c", etcd_->endpoint()), nullptr);
  // Within a ping and its timeout (8 s) and the reopening: generous, the machine is shared.
  EXPECT_TRUE(Eventually([&] { return ListedLive(*a, "node-c"); }, absl::Seconds(60))) << a->Log();
  EXPECT_TRUE(Eventually([&] { return Connected(*a); })) << a->Log();
}

// Node B's daemon is killed and started again within its lease's TTL: the new one takes B's
// key over with a PUT on a new lease, and etcd never deletes it. Node A tells this from a
// daemon rewriting its own key (same lease) and from a node that went: B's earlier registration
// ended, so whatever it held (the ranks of groups spanning A and B) is watched by nobody, and A
// says so, as it does for a node whose key was deleted; B is listed live on its new lease.
TEST_F(ClusterAtScaleTest, ADaemonRestartedWithinItsLeaseEndsItsEarlierRegistration) {
  DaemonProcess* a = StartNode("node-a", etcd_->endpoint());
  DaemonProcess* b = StartNode("node-b", etcd_->endpoint(), "lease_ttl_ms: 60000\n");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  nlohmann::json before;
  ASSERT_TRUE(Eventually([&] {
    before = Listed(*a, "node-b");
    return before.is_object() && before["live"] == true;
  }));
  // A rewrite of B's key on its own lease ends nothing.
  absl::SleepFor(absl::Seconds(1));
  EXPECT_THAT(a->Log(), ::testing::Not(HasSubstr("node node-b is gone")));

  ASSERT_TRUE(b->Stop(SIGKILL).ok());
  b = StartNode("node-b", etcd_->endpoint(), "lease_ttl_ms: 60000\n");
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a->WaitForLog("node node-b is gone: its commd registered again on a new lease",
                            absl::Seconds(30)))
      << a->Log();
  nlohmann::json after;
  EXPECT_TRUE(Eventually([&] {
    after = Listed(*a, "node-b");
    return after.is_object() && after["live"] == true && after["lease_id"] != before["lease_id"];
  })) << before.dump()
      << "\n"
      << after.dump();
}

// 128 sessions of one uid, 64 on each of two nodes, each adding 1 to one shared counter 10 times
// and setting 10 keys of its own, all at once: every call succeeds, no add is lost, every key
// is there. (Before: every write was a transaction conditioned on all of the uid's usage, a
// loser retried up to 64 times and then failed ABORTED; 128 writers on one node failed 674 of
// 2,560 calls and the counter read 875.)
TEST_F(ClusterAtScaleTest, ManyWritersOfOneUidAtOnceAllSucceedAndNoAddIsLost) {
  DaemonProcess* a = StartNode("node-a", etcd_->endpoint());
  DaemonProcess* b = StartNode("node-b", etcd_->endpoint());
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(Eventually([&] { return Connected(*a) && Connected(*b); }));
  constexpr int kWriters = 128, kCalls = 10;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kWriters; ++i) {
    auto c = Client::Connect({.runtime_dir = (i % 2 == 0 ? a : b)->runtime_dir(), .job_id = "j"});
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  std::atomic<int> failed{0};
  std::vector<std::string> errors(kWriters);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      for (int n = 0; n < kCalls; ++n) {
        const absl::StatusOr<int64_t> added = clients[i]->store().Add("counter", 1);
        const absl::Status set =
            clients[i]->store().Set(absl::StrCat("w", i, "-", n), absl::StrCat(i * 100 + n));
        for (const absl::Status& s : {added.status(), set}) {
          if (s.ok()) continue;
          ++failed;
          errors[i] = s.ToString();
        }
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0) << absl::StrJoin(errors, "\n");
  // Read back on both nodes: the counter holds every add, each key its value.
  for (size_t node = 0; node < 2; ++node) {
    Client& reader = *clients[node];
    EXPECT_EQ(reader.store().Add("counter", 0).value_or(-1), kWriters * kCalls);
    for (int i = 0; i < kWriters; i += 17) {
      for (int n = 0; n < kCalls; ++n) {
        EXPECT_EQ(reader.store().Get(absl::StrCat("w", i, "-", n)).value_or("missing"),
                  absl::StrCat(i * 100 + n));
      }
    }
  }
  // Each node accounts for what it wrote under its own usage key.
  EXPECT_THAT(
      etcd_->Keys(absl::StrCat(kPrefix, "/usage/")),
      ::testing::UnorderedElementsAre(absl::StrCat(kPrefix, "/usage/", ::getuid(), "/j/node-a"),
                                      absl::StrCat(kPrefix, "/usage/", ::getuid(), "/j/node-b")));
}

// A three-member etcd loses its leader, then one member more, and so its quorum. Without the
// leader, the two others elect a new one: every node keeps its registration and lease, nobody is
// told a node is gone, and the watches go on delivering (a node that comes afterwards appears).
// Without a quorum etcd answers nothing: the nodes say they are cut off, and still nobody is
// told a node is gone, since no lease ends without a leader to end it. When the members come
// back, every node is connected again on the lease it had and its watches deliver again.
class EtcdMembersTest : public ClusterAtScaleTest {
 protected:
  void SetUp() override {
    if (::access(kEtcd, X_OK) != 0) {
      GTEST_SKIP() << kEtcd << " is missing: install Debian's etcd-server (scripts/install-deps)";
    }
    auto members = Etcd::StartCluster(tmp_.Join("etcd"), 3);
    ASSERT_TRUE(members.ok()) << members.status();
    members_ = std::move(*members);
    for (const auto& m : members_) endpoints_.push_back(m->endpoint());
  }
  void TearDown() override {
    ClusterAtScaleTest::TearDown();
    for (auto& m : members_) m->Kill();
  }
  // Every node in `nodes` lists every node in `names` live, on the lease in `leases` if given.
  bool AllListLive(const std::vector<DaemonProcess*>& nodes, const std::vector<std::string>& names,
                   const std::map<std::string, nlohmann::json>& leases = {}) {
    for (DaemonProcess* d : nodes) {
      for (const std::string& name : names) {
        const nlohmann::json n = Listed(*d, name);
        if (!n.is_object() || n["live"] != true) return false;
        auto it = leases.find(name);
        if (it != leases.end() && n["lease_id"] != it->second) return false;
      }
    }
    return true;
  }
  static double Keepalives(const DaemonProcess& d, const std::string& result) {
    return MetricValue(
        d, absl::StrCat(R"(commd_cluster_lease_keepalives_total{result=")", result, R"("})"));
  }

  std::vector<std::unique_ptr<Etcd>> members_;
  std::vector<std::string> endpoints_;
};

TEST_F(EtcdMembersTest, LosingTheLeaderChangesNothingAndLosingQuorumOnlyCutsNodesOff) {
  size_t leader = members_.size();
  ASSERT_TRUE(Eventually([&] {
    for (size_t m = 0; m < members_.size(); ++m) {
      if (members_[m]->IsLeader()) leader = m;
    }
    return leader < members_.size();
  }));
  // The nodes talk to the leader first (a daemon starts with its first endpoint), so that
  // losing it makes them move to another member.
  std::vector<std::string> leader_first = {endpoints_[leader]}, left;
  for (size_t m = 0; m < members_.size(); ++m) {
    if (m != leader) left.push_back(endpoints_[m]);
  }
  leader_first.insert(leader_first.end(), left.begin(), left.end());
  // A short lease (keep-alives every 2 s): one that ran out during the losses would show.
  const std::string in_cluster = "lease_ttl_ms: 6000\n";
  DaemonProcess* a = StartNode("node-a", leader_first, in_cluster);
  DaemonProcess* b = StartNode("node-b", leader_first, in_cluster);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(Eventually([&] { return AllListLive({a, b}, {"node-a", "node-b"}); }));
  const std::map<std::string, nlohmann::json> leases = {
      {"node-a", Listed(*b, "node-a")["lease_id"]}, {"node-b", Listed(*a, "node-b")["lease_id"]}};
  const auto none_gone = [&] {
    for (DaemonProcess* d : {a, b}) {
      EXPECT_THAT(d->Log(), ::testing::Not(HasSubstr(" is gone"))) << d->Log();
    }
  };

  const double a_ok = Keepalives(*a, "ok"), b_ok = Keepalives(*b, "ok");
  members_[leader]->Kill();
  // A node that comes afterwards, told only of the members left, appears in both views.
  ASSERT_NE(StartNode("node-c", left, in_cluster), nullptr);
  EXPECT_TRUE(Eventually(
      [&] {
        return AllListLive({a, b}, {"node-c"});
      },
      absl::Seconds(60)))
      << a->Log() << b->Log();
  // A lease's worth of keep-alives answered since the leader went, on the same leases.
  EXPECT_TRUE(Eventually(
      [&] { return Keepalives(*a, "ok") >= a_ok + 3 && Keepalives(*b, "ok") >= b_ok + 3; },
      absl::Seconds(60)));
  EXPECT_TRUE(AllListLive({a, b}, {"node-a", "node-b"}, leases));
  EXPECT_TRUE(Connected(*a) && Connected(*b));
  none_gone();

  // One member more goes: no quorum.
  const size_t second = leader == 0 ? 1 : 0;
  members_[second]->Kill();
  EXPECT_TRUE(Eventually([&] { return !Connected(*a) && !Connected(*b); }, absl::Seconds(60)))
      << a->Log() << b->Log();
  // Past the lease's TTL without a quorum (three keep-alives unanswered): nothing ends.
  const double a_failed = Keepalives(*a, "failed");
  EXPECT_TRUE(
      Eventually([&] { return Keepalives(*a, "failed") >= a_failed + 3; }, absl::Seconds(60)));
  none_gone();

  // Both come back (each with the data it had): the nodes reconnect on their leases, and
  // their watches deliver again.
  for (size_t m : {leader, second}) ASSERT_EQ(members_[m]->Start(), absl::OkStatus());
  EXPECT_TRUE(Eventually([&] { return Connected(*a) && Connected(*b); }, absl::Seconds(60)))
      << a->Log() << b->Log();
  EXPECT_TRUE(Eventually([&] { return AllListLive({a, b}, {"node-a", "node-b"}, leases); }));
  ASSERT_NE(StartNode("node-d", endpoints_, in_cluster), nullptr);
  EXPECT_TRUE(Eventually(
      [&] {
        return AllListLive({a, b}, {"node-d"});
      },
      absl::Seconds(60)))
      << a->Log() << b->Log();
  none_gone();
}

}  // namespace
}  // namespace commd::testing
