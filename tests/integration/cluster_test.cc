// The cluster against a real etcd (Debian's etcd-server) on loopback: real daemons acting as
// nodes (their own runtime dirs and node names, one etcd), real clients. Covers the node's
// lease and key through etcd's absence, loss and return, and the job store shared by nodes.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commd/commd.h"
#include "commd/v1/node.grpc.pb.h"
#include "commd/v1/store.grpc.pb.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/raw_grpc.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kPrefix[] = "/commd-test";

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kEtcd, X_OK) != 0) {
      GTEST_SKIP() << kEtcd << " is missing: install Debian's etcd-server (scripts/install-deps)";
    }
    etcd_ = std::make_unique<Etcd>(tmp_.Join("etcd"));
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& d : daemons_)
        std::cerr << "--- daemon " << d->runtime_dir() << ":\n" << d->Log();
    }
    daemons_.clear();
    if (etcd_ != nullptr) etcd_->Kill();
  }

  // A daemon named `node` on its own runtime dir, pointed at the test's etcd; `in_cluster` goes
  // inside its cluster section.
  DaemonProcess* StartNode(const std::string& node, const std::string& extra_config = "",
                           const std::string& in_cluster = "") {
    auto dir = std::make_unique<TempDir>("commd-node");
    ::chmod(dir->path().c_str(), 0755);  // another uid's client may reach the sockets
    const std::string config = absl::StrCat(R"(socket_group: "nogroup"
cluster {
  etcd_endpoints: ")",
                                            etcd_->endpoint(), R"("
  node_name: ")",
                                            node, R"("
  prefix: ")",
                                            kPrefix, R"("
  lease_ttl_ms: 2000
  job_lease_ttl_ms: 2000
  call_timeout_ms: 2000
  retry_initial_ms: 50
  retry_max_ms: 400
)",
                                            in_cluster, "}\n", extra_config);
    auto d = StartDaemonWithConfig(*dir, config, {"--dump-dir", dir->Join("dumps")});
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    dirs_.push_back(std::move(dir));
    daemons_.push_back(std::move(*d));
    return daemons_.back().get();
  }
  // etcd, and two nodes connected to it (ASSERT inside: check HasFatalFailure after).
  void StartTwoNodes(DaemonProcess** a, DaemonProcess** b, const std::string& extra_config = "") {
    ASSERT_EQ(etcd_->Start(), absl::OkStatus());
    *a = StartNode("node-a", extra_config);
    *b = StartNode("node-b", extra_config);
    ASSERT_NE(*a, nullptr);
    ASSERT_NE(*b, nullptr);
    // Connected, and watching for the job dumps the other node announces.
    ASSERT_TRUE(Eventually([&] {
      return Connected(**a) && Connected(**b) &&
             MetricValue(**a, "commd_cluster_job_dumps_watching") == 1 &&
             MetricValue(**b, "commd_cluster_job_dumps_watching") == 1;
    }));
  }
  static bool Connected(const DaemonProcess& d) {
    return MetricValue(d, "commd_cluster_connected") == 1;
  }
  static std::unique_ptr<Client> Connect(const DaemonProcess& d, const std::string& job = "job") {
    auto c = Client::Connect({.runtime_dir = d.runtime_dir(), .job_id = job});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static std::string StatusJson(const DaemonProcess& d) {
    return RunProcess({COMMCTL_BINARY, "--runtime-dir", d.runtime_dir(), "--json", "status"})
        .output;
  }
  // commctl `args` against a daemon of its own, started without a cluster section.
  static ProcessResult CommctlWithoutACluster(const std::vector<std::string>& args) {
    TempDir dir("commd-plain");
    auto plain = StartDaemonWithConfig(dir, "");
    EXPECT_TRUE(plain.ok()) << plain.status();
    if (!plain.ok()) return {.output = plain.status().ToString()};
    std::vector<std::string> argv = {COMMCTL_BINARY, "--runtime-dir", (*plain)->runtime_dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv);
  }
  // Node-local work: a group of one rank forms and passes a barrier.
  // (A new group name each time: a group's name is taken until its members' sessions end.)
  static absl::Status LocalGroupWorks(Client& client, const std::string& name) {
    ASSIGN_OR_RETURN(auto group, client.JoinGroup({.name = name, .rank = 0, .world_size = 1}));
    return group->Barrier();
  }
  std::string NodeKey(const std::string& node) const {
    return absl::StrCat(kPrefix, "/nodes/", node);
  }
  // The node's dump_dir (StartNode puts it beside the runtime dir).
  static std::string DumpDir(const DaemonProcess& d) {
    return std::filesystem::path(d.runtime_dir()).parent_path() / "dumps";
  }
  // The files of dump `id` of job "job" on node `d`, as group/file names, once there are
  // `count` (or a minute has passed).
  static std::vector<std::string> DumpFiles(const DaemonProcess& d, const std::string& id,
                                            size_t count) {
    std::vector<std::string> files;
    Eventually(
        [&] {
          files.clear();
          std::error_code ec;
          const std::filesystem::path dir = std::filesystem::path(DumpDir(d)) / "job" / id;
          for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
               !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
            if (it->is_regular_file()) {
              files.push_back(std::filesystem::relative(it->path(), dir).string());
            }
          }
          std::sort(files.begin(), files.end());
          return files.size() >= count;
        },
        absl::Seconds(60));
    return files;
  }
  // A group `name` of one rank with global rank `global_rank`, after one barrier.
  static std::unique_ptr<Group> OneRankGroup(Client& client, int global_rank,
                                             const std::string& name = "g") {
    auto g =
        client.JoinGroup({.name = name, .rank = 0, .world_size = 1, .global_rank = global_rank});
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return nullptr;
    EXPECT_TRUE((*g)->Barrier().ok());
    return std::move(*g);
  }

  TempDir tmp_{"commd-cluster"};
  std::unique_ptr<Etcd> etcd_;
  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

TEST_F(ClusterTest, StartsWithoutEtcdServesItsNodeAndConnectsWhenEtcdComes) {
  DaemonProcess* node = StartNode("node-a");
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(MetricValue(*node, "commd_cluster_connected"), 0);
  EXPECT_THAT(StatusJson(*node), HasSubstr("disconnected"));
  auto client = Connect(*node);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(LocalGroupWorks(*client, "local-1").ok());
  // Store calls fail naming the endpoint; the node's own store does not stand in.
  const absl::Status set = client->store().Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_THAT(set.message(), HasSubstr(etcd_->endpoint()));
  // Several retries (50 ms doubling to 400 ms) later, still one line for the one state.
  absl::SleepFor(absl::Seconds(2));
  const std::string log = node->Log();
  const std::vector<std::string> pieces = absl::StrSplit(log, "cluster: disconnected");
  EXPECT_EQ(pieces.size(), 2u) << log;

  ASSERT_EQ(etcd_->Start(), absl::OkStatus());
  ASSERT_TRUE(Eventually([&] { return Connected(*node); })) << node->Log();
  EXPECT_THAT(StatusJson(*node), HasSubstr("\"connected\""));
  EXPECT_THAT(etcd_->Keys(NodeKey("node-a")), ::testing::ElementsAre(NodeKey("node-a")));
  EXPECT_TRUE(client->store().Set("k", "v").ok());
  EXPECT_THAT(node->Log(), HasSubstr("cluster: connected to etcd at " + etcd_->endpoint()));
}

TEST_F(ClusterTest, EtcdLostLeavesNodeWorkAloneAndReconnectsWhenBack) {
  ASSERT_EQ(etcd_->Start(), absl::OkStatus());
  DaemonProcess* node = StartNode("node-a");
  ASSERT_NE(node, nullptr);
  ASSERT_TRUE(Eventually([&] { return Connected(*node); })) << node->Log();
  auto client = Connect(*node);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->store().Set("before", "1").ok());
  // A wait under way when etcd goes fails with it (its watch stream breaks), naming etcd.
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = client->store().Wait({"never"}, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(500));

  // The lease as an operator sees it: granted 2 s, and never more left than that.
  EXPECT_EQ(MetricValue(*node, "commd_cluster_lease_ttl_seconds"), 2);
  EXPECT_GT(MetricValue(*node, "commd_cluster_lease_remaining_seconds"), 0);
  EXPECT_LE(MetricValue(*node, "commd_cluster_lease_remaining_seconds"), 2);

  etcd_->Kill();
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(waited.message(), HasSubstr(etcd_->endpoint()));
  ASSERT_TRUE(Eventually([&] { return !Connected(*node); })) << node->Log();
  // Unanswered keep-alives are counted, and what is left of the lease runs out to 0.
  EXPECT_GE(MetricValue(*node, "commd_cluster_lease_keepalives_total{result=\"failed\"}"), 1);
  EXPECT_TRUE(
      Eventually([&] { return MetricValue(*node, "commd_cluster_lease_remaining_seconds") == 0; }));
  EXPECT_THAT(StatusJson(*node), HasSubstr("disconnected"));
  const absl::Status set = client->store().Set("during", "1");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_THAT(set.message(), HasSubstr(etcd_->endpoint()));
  EXPECT_EQ(client->store().Get("before").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(LocalGroupWorks(*client, "local-2").ok());

  ASSERT_EQ(etcd_->Start(), absl::OkStatus());  // same data dir, same port
  ASSERT_TRUE(Eventually([&] { return Connected(*node); })) << node->Log();
  EXPECT_THAT(etcd_->Keys(NodeKey("node-a")), ::testing::ElementsAre(NodeKey("node-a")));
  EXPECT_GT(MetricValue(*node, "commd_cluster_lease_remaining_seconds"), 0);
  EXPECT_TRUE(client->store().Set("after", "2").ok());
  EXPECT_EQ(*client->store().Get("after"), "2");
  EXPECT_TRUE(LocalGroupWorks(*client, "local-3").ok());
}

TEST_F(ClusterTest, NodeKeyGoesWithItsDaemon) {
  ASSERT_EQ(etcd_->Start(), absl::OkStatus());
  DaemonProcess* killed = StartNode("node-killed");
  DaemonProcess* stopped = StartNode("node-stopped");
  ASSERT_NE(killed, nullptr);
  ASSERT_NE(stopped, nullptr);
  ASSERT_TRUE(Eventually([&] { return Connected(*killed) && Connected(*stopped); }));
  EXPECT_EQ(etcd_->Keys(absl::StrCat(kPrefix, "/nodes/")).size(), 2u);
  // Killed: nothing refreshes its lease, so etcd drops the key after lease_ttl_ms.
  ASSERT_TRUE(killed->Stop(SIGKILL).ok());
  EXPECT_TRUE(Eventually([&] { return etcd_->Keys(NodeKey("node-killed")).empty(); }));
  // Stopped cleanly: the daemon revokes its lease on the way out.
  ASSERT_TRUE(stopped->Stop(SIGTERM).ok());
  EXPECT_TRUE(etcd_->Keys(NodeKey("node-stopped")).empty());
}

// What `commctl cluster nodes --json` prints, parsed; a null json when it failed.
nlohmann::json ListNodes(const DaemonProcess& d) {
  const ProcessResult r =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", d.runtime_dir(), "--json", "cluster", "nodes"});
  if (r.exit_code != 0) return nullptr;
  return nlohmann::json::parse(r.output, nullptr, false);
}

// The entry of node `name` in a ListNodes answer; null when it is not listed.
nlohmann::json Node(const nlohmann::json& list, const std::string& name) {
  if (!list.is_object() || !list.contains("nodes")) return nullptr;
  for (const auto& n : list["nodes"]) {
    if (n["name"] == name) return n;
  }
  return nullptr;
}

// `commctl cluster nodes` lists both nodes from node-a's view of etcd: itself with its lease's
// TTL and what is left of it (as its metrics say), node-b with the TTL its key says and its
// metrics address. Once node-b's daemon is killed, node-a reports it gone, after its lease
// ended (how long after the kill is printed, against the TTL: docs/PERFORMANCE.md).
TEST_F(ClusterTest, CommctlListsTheNodesAndAKilledOneAsGoneAfterItsLease) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  nlohmann::json list;
  ASSERT_TRUE(Eventually([&] {
    list = ListNodes(*a);
    return Node(list, "node-a").is_object() && Node(list, "node-b").is_object();
  })) << list.dump();
  EXPECT_EQ(list["live_nodes"], 2);
  EXPECT_EQ(list["gone_nodes"], 0);
  EXPECT_EQ(list["truncated"], false);
  EXPECT_EQ(list["watching"], true);
  const nlohmann::json self = Node(list, "node-a");
  EXPECT_EQ(self["this_node"], true);
  EXPECT_EQ(self["live"], true);
  EXPECT_EQ(self["lease_ttl_seconds"], "2");  // proto3 JSON: int64 as a string
  EXPECT_GT(self["lease_remaining_seconds"].get<double>(), 0) << self.dump();
  EXPECT_LE(self["lease_remaining_seconds"].get<double>(), 2) << self.dump();
  EXPECT_EQ(self["metrics_address"], a->metrics_address());
  const nlohmann::json other = Node(list, "node-b");
  EXPECT_EQ(other["this_node"], false);
  EXPECT_EQ(other["live"], true);
  EXPECT_EQ(other["lease_ttl_seconds"], "2");
  EXPECT_EQ(other["lease_remaining_seconds"], -1);  // not known: etcd is not asked per node
  EXPECT_EQ(other["metrics_address"], b->metrics_address());
  EXPECT_NE(other["lease_id"], "0");
  // The lease as node-a's metrics show it, and its keep-alives.
  EXPECT_EQ(MetricValue(*a, "commd_cluster_lease_ttl_seconds"), 2);
  const double left = MetricValue(*a, "commd_cluster_lease_remaining_seconds");
  EXPECT_GT(left, 0);
  EXPECT_LE(left, 2);
  EXPECT_TRUE(Eventually(
      [&] { return MetricValue(*a, "commd_cluster_lease_keepalives_total{result=\"ok\"}") >= 2; }));
  EXPECT_EQ(MetricValue(*a, "commd_cluster_lease_keepalives_total{result=\"failed\"}"), 0);
  EXPECT_EQ(MetricValue(*a, "commd_cluster_lease_keepalives_total{result=\"expired\"}"), 0);
  EXPECT_EQ(MetricValue(*a, "commd_cluster_lease_grants_total"), 1);
  const ProcessResult text =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "cluster", "nodes"});
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("2 live node(s), 0 gone"));
  EXPECT_THAT(text.output, ::testing::ContainsRegex("node-a \\(this\\) +live "));
  EXPECT_THAT(text.output, ::testing::ContainsRegex("node-b +live "));
  std::cerr << text.output;

  const absl::Time killed = absl::Now();
  ASSERT_TRUE(b->Stop(SIGKILL).ok());
  ASSERT_TRUE(Eventually([&] {
    list = ListNodes(*a);
    return Node(list, "node-b").is_object() && Node(list, "node-b")["live"] == false;
  })) << list.dump();
  const absl::Time reported = absl::Now();
  EXPECT_EQ(list["live_nodes"], 1);
  EXPECT_EQ(list["gone_nodes"], 1);
  const nlohmann::json gone = Node(list, "node-b");
  // since_unix_ms: when node-a's watch heard the key go.
  const int64_t since = std::stoll(gone["since_unix_ms"].get<std::string>());
  std::cerr << "node-b killed; node-a's view has it gone " << since - absl::ToUnixMillis(killed)
            << " ms later (commctl saw it after " << absl::ToInt64Milliseconds(reported - killed)
            << " ms); lease TTL 2000 ms\n";
  EXPECT_GE(since, absl::ToUnixMillis(killed));
  const ProcessResult after =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "cluster", "nodes"});
  EXPECT_THAT(after.output, HasSubstr("1 live node(s), 1 gone"));
  EXPECT_THAT(after.output, ::testing::ContainsRegex("node-b +gone "));
  std::cerr << after.output;
}

// The sum of etcd's counts of the KV calls it started (Range, Txn, Put, ...): what the nodes'
// daemons have asked of it.
double EtcdKvCalls(const Etcd& etcd) {
  auto text = HttpGet(etcd.endpoint(), "/metrics");
  if (!text.ok()) return -1;
  auto parsed = ParsePrometheusText(*text);
  if (!parsed.ok()) return -1;
  double sum = 0;
  for (const auto& [key, value] : *parsed) {
    if (absl::StartsWith(key, "grpc_server_started_total{") &&
        absl::StrContains(key, "grpc_service=\"etcdserverpb.KV\"")) {
      sum += value;
    }
  }
  return sum;
}

// Listing the nodes is answered from the daemon's view: a caller without a session gets
// UNAUTHENTICATED, a limit or start_after out of range INVALID_ARGUMENT naming the range, an
// answer holds at most the limit and says what follows, keys that another writer of etcd put
// under nodes/ are left out and counted, a flood of calls asks etcd nothing, and with etcd gone
// the last view is still answered, saying so.
TEST_F(ClusterTest, ListingNodesIsBoundedAndAsksEtcdNothing) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  auto stub = v1::Node::NewStub(RawChannel(a->runtime_dir()));
  EXPECT_EQ(UnauthenticatedProblems([&](grpc::ClientContext& ctx) {
              v1::ListClusterNodesResponse out;
              return stub->ListClusterNodes(&ctx, {}, &out);
            }),
            "");
  // Another writer of etcd: a key that names no node, and a "node" whose value is not commd's.
  ASSERT_TRUE(etcd_->Put(absl::StrCat(kPrefix, "/nodes/not a node"), "x").ok());
  ASSERT_TRUE(etcd_->Put(NodeKey("node-x"), std::string(100000, '{')).ok());
  auto client = Connect(*a);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::ListClusterNodesResponse> all;
  ASSERT_TRUE(Eventually([&] {
    all = client->ListClusterNodes();
    return all.ok() && all->live_nodes() == 3;
  })) << all.status();
  EXPECT_EQ(all->rejected_keys(), 1u);
  ASSERT_EQ(all->nodes_size(), 3);
  EXPECT_EQ(all->nodes(2).name(), "node-x");
  EXPECT_EQ(all->nodes(2).owner(), "");  // its value is not parsed: too long
  EXPECT_EQ(all->nodes(2).lease_id(), 0);

  // Pages: one node per answer, and what comes next.
  ProcessResult page = RunProcess(
      {COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "cluster", "nodes", "--limit", "1"});
  EXPECT_EQ(page.exit_code, 0) << page.output;
  EXPECT_THAT(page.output, HasSubstr("showing 1 of 3 node(s); the next ones: commctl cluster "
                                     "nodes --after node-a"));
  EXPECT_THAT(page.output, HasSubstr("1 key(s) under the cluster's nodes/ name no node"));
  page = RunProcess({COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "cluster", "nodes",
                     "--limit", "1", "--after", "node-a"});
  EXPECT_THAT(page.output, ::testing::ContainsRegex("\nnode-b +live "));
  EXPECT_THAT(page.output, ::testing::Not(HasSubstr("node-x")));
  // Out of range: the daemon says the range (commctl exits 2 on INVALID_ARGUMENT).
  const ProcessResult big = RunProcess(
      {COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "cluster", "nodes", "--limit", "5000"});
  EXPECT_EQ(big.exit_code, 2) << big.output;
  EXPECT_THAT(big.output, HasSubstr("INVALID_ARGUMENT: limit 5000 is out of range; allowed 1 to "
                                    "1000 nodes per answer"));
  v1::ListClusterNodesRequest bad;
  bad.set_start_after(std::string(1 << 20, 'n'));
  const auto refused = client->ListClusterNodes(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("(1048576 bytes) names no node"));

  // 300 calls ask etcd nothing: its count of KV calls moves only with the daemons' own work
  // (node counts, about one per node every few seconds).
  const double before = EtcdKvCalls(*etcd_);
  ASSERT_GE(before, 0);
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(client->ListClusterNodes().ok());
  const double asked = EtcdKvCalls(*etcd_) - before;
  std::cerr << "300 ListClusterNodes calls; etcd's KV calls meanwhile: " << asked << "\n";
  EXPECT_LT(asked, 30);

  // etcd gone: the last view, saying it is not watching.
  etcd_->Kill();
  ASSERT_TRUE(Eventually([&] {
    all = client->ListClusterNodes();
    return all.ok() && !all->watching();
  })) << all.status();
  EXPECT_EQ(all->live_nodes(), 3u);
  const ProcessResult stale =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "cluster", "nodes"});
  EXPECT_EQ(stale.exit_code, 0) << stale.output;
  EXPECT_THAT(stale.output, HasSubstr("not watching etcd (out of reach): the view as of "));

  // A daemon without a cluster has no nodes to list.
  const ProcessResult alone = CommctlWithoutACluster({"cluster", "nodes"});
  EXPECT_EQ(alone.exit_code, 1) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("FAILED_PRECONDITION: this daemon is not in a cluster"));
}

TEST_F(ClusterTest, ASecondDaemonWithTheSameNodeNameIsRefused) {
  ASSERT_EQ(etcd_->Start(), absl::OkStatus());
  DaemonProcess* first = StartNode("twin");
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(Eventually([&] { return Connected(*first); }));
  DaemonProcess* second = StartNode("twin");
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(second->WaitForLog("is held in etcd at", absl::Seconds(30))) << second->Log();
  EXPECT_THAT(second->Log(), HasSubstr("give each node its own cluster.node_name"));
  EXPECT_EQ(MetricValue(*second, "commd_cluster_connected"), 0);
  EXPECT_TRUE(Connected(*first));
}

TEST_F(ClusterTest, OneStoreForTheJobOnEveryNode) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  auto on_a = Connect(*a);
  auto on_b = Connect(*b);
  ASSERT_TRUE(on_a->store().Set("addr", std::string("10.0.0.1\0:29500", 15)).ok());
  EXPECT_EQ(*on_b->store().Get("addr"), std::string("10.0.0.1\0:29500", 15));
  EXPECT_EQ(on_b->store().Get("absent").status().code(), absl::StatusCode::kNotFound);

  // A wait on B completes when A writes (an etcd watch), and names what is still missing.
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = on_b->store().Wait({"late", "addr"}, absl::Seconds(60)); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(on_a->store().Set("late", "x").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  const absl::Status timed_out = on_b->store().Wait({"never"}, absl::Milliseconds(300));
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.message(), HasSubstr("store keys still missing: \"never\""));

  // Adds from both nodes at once are all counted.
  std::vector<std::thread> adders;
  for (Client* c : {on_a.get(), on_b.get(), on_a.get(), on_b.get()}) {
    adders.emplace_back([c] {
      for (int i = 0; i < 10; ++i) EXPECT_TRUE(c->store().Add("n", 1).ok());
    });
  }
  for (auto& t : adders) t.join();
  EXPECT_EQ(*on_a->store().Get("n"), "40");
  EXPECT_EQ(*on_b->store().Add("n", 2), 42);

  // Compare-set: the first writer wins, the second hears the winner's value.
  EXPECT_EQ(*on_a->store().CompareSet("leader", "", "a"), "a");
  EXPECT_EQ(*on_b->store().CompareSet("leader", "", "b"), "a");
  EXPECT_EQ(*on_b->store().CompareSet("leader", "a", "b"), "b");
  EXPECT_TRUE(*on_b->store().Delete("leader"));
  EXPECT_FALSE(*on_a->store().Delete("leader"));
  EXPECT_EQ(on_a->store().Get("leader").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(on_a->store().Set("t", "text").ok());
  EXPECT_EQ(on_b->store().Add("t", 1).status().code(), absl::StatusCode::kFailedPrecondition);

  // Another job's store, on either node, is another store.
  EXPECT_EQ(Connect(*b, "other")->store().Get("addr").status().code(), absl::StatusCode::kNotFound);
}

// The cluster store takes no call without a session: a raw gRPC caller with no token, or a
// made-up one, is UNAUTHENTICATED and writes nothing into etcd.
TEST_F(ClusterTest, StoreCallsWithoutASessionAreUnauthenticated) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  auto stub = v1::Store::NewStub(RawChannel(a->runtime_dir()));
  v1::SetRequest set;
  set.set_key("stolen");
  set.set_value("x");
  EXPECT_EQ(UnauthenticatedProblems([&](grpc::ClientContext& ctx) {
              v1::SetResponse out;
              return stub->Set(&ctx, set, &out);
            }),
            "");
  EXPECT_EQ(Connect(*b)->store().Get("stolen").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, StoreLimitsHoldAcrossNodes) {
  const std::string limits = R"(limits {
  max_store_keys_per_job: 4
  max_store_value_bytes: 64
  max_store_bytes_per_job: 200
  per_uid { store_keys: 6 }
})";
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b, limits);
  if (HasFatalFailure()) return;
  auto on_a = Connect(*a);
  auto on_b = Connect(*b);
  const absl::Status big = on_a->store().Set("v", std::string(65, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(big.message(), "store value of 65 bytes exceeds limits.max_store_value_bytes 64");
  // 2 + 60 bytes each: three fill 186 of the job's 200 bytes, wherever they were written.
  const std::string sixty(60, 'x');
  ASSERT_TRUE(on_a->store().Set("k1", sixty).ok());
  ASSERT_TRUE(on_b->store().Set("k2", sixty).ok());
  ASSERT_TRUE(on_a->store().Set("k3", sixty).ok());
  const absl::Status bytes = on_b->store().Set("k4", sixty);
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bytes.message(),
            "store of job 'job' would hold 248 bytes, over limits.max_store_bytes_per_job 200");
  ASSERT_TRUE(on_b->store().Set("k4", "").ok());
  const absl::Status keys = on_a->store().Set("k5", "");
  EXPECT_EQ(keys.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(keys.message(), "job 'job' holds 4 store keys, at limits.max_store_keys_per_job 4");
  // The uid's second job has 2 of the uid's 6 keys left.
  auto other = Connect(*b, "other");
  ASSERT_TRUE(other->store().Set("o1", "").ok());
  ASSERT_TRUE(other->store().Set("o2", "").ok());
  const absl::Status uid = other->store().Set("o3", "");
  EXPECT_EQ(uid.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(uid.message(), "uid 0 holds 6 of its 6 store keys (limits.per_uid.store_keys)");
  // Deleting on one node gives the room back on the other.
  EXPECT_TRUE(*on_a->store().Delete("k1"));
  EXPECT_TRUE(other->store().Set("o3", "").ok());
}

// The same job id under another uid is another store, on every node.
TEST_F(ClusterTest, AnotherUidsJobOfTheSameIdSeesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setpriv)";
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(Connect(*a)->store().Set("secret", "mine").ok());
  auto as_nobody = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                               "--clear-groups", COMMD_TEST_CLIENT});
    return RunProcess(args, absl::Seconds(30),
                      {"COMMD_RUNTIME_DIR=" + b->runtime_dir(), "COMMD_JOB_ID=job"});
  };
  EXPECT_THAT(as_nobody({"store-get", "secret"}).output, HasSubstr("got NOT_FOUND"));
  EXPECT_THAT(as_nobody({"store-set", "secret", "theirs"}).output, HasSubstr("set"));
  EXPECT_THAT(as_nobody({"store-get", "secret"}).output, HasSubstr("got OK theirs"));
  EXPECT_EQ(*Connect(*b)->store().Get("secret"), "mine");
}

// The job's keys hang on its lease: they stay while any node has a rank of the job, and go
// once the last rank on every node has left.
TEST_F(ClusterTest, JobKeysGoWhenTheLastRankOnEveryNodeHasLeft) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  const std::string job_keys = absl::StrCat(kPrefix, "/jobs/0/job/store/");
  auto on_a = Connect(*a);
  auto on_b = Connect(*b);
  ASSERT_TRUE(on_a->store().Set("k", "v").ok());
  ASSERT_EQ(*on_b->store().Get("k"), "v");
  on_a.reset();  // node A's last rank of the job leaves
  // Node B still refreshes the job's lease: three of its TTLs later the key is there.
  absl::SleepFor(absl::Seconds(6));
  EXPECT_THAT(etcd_->Keys(job_keys), ::testing::ElementsAre(job_keys + "k"));
  EXPECT_EQ(*on_b->store().Get("k"), "v");
  on_b.reset();
  EXPECT_TRUE(Eventually([&] { return etcd_->Keys(absl::StrCat(kPrefix, "/jobs/")).empty(); }));
  EXPECT_TRUE(etcd_->Keys(absl::StrCat(kPrefix, "/usage/")).empty());
}

// One dump for the job: a dump of the job asked on node A is announced in etcd, and node B
// dumps its ranks of the job under the same id; `commctl fr collect` puts both nodes' files
// into one folder per group, which `commctl fr export` converts for torchfrtrace.
TEST_F(ClusterTest, AJobDumpAskedOnOneNodeIsDumpedOnEveryNodeUnderOneId) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  auto on_a = Connect(*a);
  auto on_b = Connect(*b);
  auto other_job = Connect(*b, "other");
  auto g0 = OneRankGroup(*on_a, 0);
  auto g1 = OneRankGroup(*on_b, 1);
  auto other = OneRankGroup(*other_job, 7);
  ASSERT_TRUE(g0 && g1 && other);

  const ProcessResult dump = RunProcess(
      {COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "--json", "dump", "--job", "job"});
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  const nlohmann::json response = nlohmann::json::parse(dump.output, nullptr, false);
  ASSERT_TRUE(response.is_object()) << dump.output;
  EXPECT_EQ(response["announced"], true) << dump.output;
  EXPECT_EQ(response["announce_error"], "") << dump.output;
  const std::string id = response["dump_id"];
  EXPECT_THAT(id, ::testing::MatchesRegex("[0-9]{8}T[0-9.]+Z-request-node-a"));
  EXPECT_THAT(etcd_->Keys(absl::StrCat(kPrefix, "/dumps/")),
              ::testing::ElementsAre(absl::StrCat(kPrefix, "/dumps/0/job/", id)));
  EXPECT_THAT(DumpFiles(*a, id, 1), ::testing::ElementsAre("g/rank0.json"));
  EXPECT_THAT(DumpFiles(*b, id, 1), ::testing::ElementsAre("g/rank1.json"));
  // Node B's other job was not dumped.
  EXPECT_FALSE(std::filesystem::exists(DumpDir(*b) + "/other")) << b->Log();
  EXPECT_GE(MetricValue(*a, "commd_cluster_job_dumps_total{event=\"published\"}"), 1);
  EXPECT_GE(MetricValue(*b, "commd_cluster_job_dumps_total{event=\"received\"}"), 1);

  // Collected from both nodes' dump dirs (as copied from each node), then exported.
  const std::string out = tmp_.Join("collected");
  const ProcessResult collect = RunProcess(
      {COMMCTL_BINARY, "fr", "collect", "--dump-id", id, "--out", out, DumpDir(*a), DumpDir(*b)});
  ASSERT_EQ(collect.exit_code, 0) << collect.output;
  EXPECT_THAT(collect.output, HasSubstr("from 2 directories"));
  EXPECT_THAT(collect.output, HasSubstr("group g: global ranks 0-1 (2 of 2)"));
  const ProcessResult exported =
      RunProcess({COMMCTL_BINARY, "fr", "export", "--in", out + "/g", "--out", tmp_.Join("torch")});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(std::filesystem::exists(tmp_.Join("torch/nccl_trace_rank_0")));
  EXPECT_TRUE(std::filesystem::exists(tmp_.Join("torch/nccl_trace_rank_1")));

  // --local: this node only, nothing announced.
  const ProcessResult local = RunProcess(
      {COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "dump", "--job", "job", "--local"});
  ASSERT_EQ(local.exit_code, 0) << local.output;
  EXPECT_THAT(local.output, ::testing::Not(HasSubstr("dump id")));
  EXPECT_EQ(etcd_->Keys(absl::StrCat(kPrefix, "/dumps/")).size(), 1u);
}

// A watchdog finding on node A (rank 1 of its group never enters a collective) is a dump of
// the job on every node, under one id that names the finding and the node: node B dumps every
// group of the job it has (what holds one group back is often another).
TEST_F(ClusterTest, AHangFoundOnOneNodeIsDumpedOnEveryNodeUnderOneId) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b, "watchdog { poll_interval_ms: 20 }\n");
  if (HasFatalFailure()) return;
  auto on_a = Connect(*a);
  auto on_b = Connect(*b);
  auto g2 = OneRankGroup(*on_b, 2, "pp");
  auto g3 = OneRankGroup(*on_a, 3, "dp");  // another group of the job on the finding's node
  ASSERT_TRUE(g2 && g3);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    auto c = ChildProcess::Start(
        {WATCHDOG_RANK, "g", std::to_string(r), "2", "notify", "1000", "lag", "3", "1", "0"},
        {"COMMD_RUNTIME_DIR=" + a->runtime_dir(), "COMMD_JOB_ID=job"});
    ASSERT_TRUE(c.ok()) << c.status();
    ranks.push_back(std::move(*c));
  }
  ASSERT_TRUE(ranks[0]->WaitForLog("CALLBACK ABORTED", absl::Seconds(60))) << ranks[0]->Log();
  // The dump's id, from node B's dump dir: the only one it has.
  std::string id;
  ASSERT_TRUE(Eventually(
      [&] {
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(DumpDir(*b) + "/job", ec)) {
          id = e.path().filename().string();
        }
        return !id.empty();
      },
      absl::Seconds(60)))
      << b->Log();
  EXPECT_THAT(id, ::testing::MatchesRegex("[0-9]{8}T[0-9.]+Z-hang-lagging-node-a"));
  EXPECT_THAT(DumpFiles(*a, id, 3),
              ::testing::ElementsAre("dp/rank3.json", "g/rank0.json", "g/rank1.json"));
  EXPECT_THAT(DumpFiles(*b, id, 1), ::testing::ElementsAre("pp/rank2.json"));
  // Node B's file carries node A's diagnosis.
  std::ifstream in(DumpDir(*b) + "/job/" + id + "/pp/rank2.json");
  const nlohmann::json rank2 = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(rank2.is_object());
  EXPECT_EQ(rank2["commd"]["diagnosis"]["kind"], "LAGGING") << rank2["commd"].dump();
  EXPECT_EQ(rank2["commd"]["diagnosis"]["ranks_behind"], nlohmann::json::array({1}));
  const ProcessResult collect = RunProcess({COMMCTL_BINARY, "fr", "collect", "--dump-id", id,
                                            "--out", tmp_.Join("all"), DumpDir(*a), DumpDir(*b)});
  ASSERT_EQ(collect.exit_code, 0) << collect.output;
  EXPECT_THAT(collect.output, HasSubstr("group g: global ranks 0-1 (2 of 2)"));
  EXPECT_THAT(collect.output, HasSubstr("group pp: global ranks 2 (1 of 1)"));
  EXPECT_THAT(collect.output, HasSubstr("group dp: global ranks 3 (1 of 1)"));
}

// With etcd gone, a job dump is still written on the node, and commctl says the other nodes
// were not asked, naming etcd's endpoint.
TEST_F(ClusterTest, AJobDumpWithEtcdGoneIsWrittenHereAndSaysTheOthersWereNotAsked) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b);
  if (HasFatalFailure()) return;
  auto on_a = Connect(*a);
  auto g0 = OneRankGroup(*on_a, 0);
  ASSERT_NE(g0, nullptr);
  etcd_->Kill();
  ASSERT_TRUE(Eventually([&] { return !Connected(*a); }));
  const ProcessResult dump =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "dump", "--job", "job"});
  EXPECT_EQ(dump.exit_code, 1) << dump.output;
  EXPECT_THAT(dump.output, HasSubstr("dumped 1 entries"));
  EXPECT_THAT(dump.output, HasSubstr("was written on this node only: the job's other nodes were "
                                     "not asked to dump"));
  EXPECT_THAT(dump.output, HasSubstr(etcd_->endpoint()));
  EXPECT_EQ(MetricValue(*a, "commd_cluster_job_dumps_total{event=\"publish_failed\"}"), 1);
  // The local files are there, under the id it would have announced.
  std::error_code ec;
  int dumps = 0;
  for (const auto& e : std::filesystem::directory_iterator(DumpDir(*a) + "/job", ec)) {
    EXPECT_TRUE(std::filesystem::exists(e.path() / "g" / "rank0.json")) << e.path();
    ++dumps;
  }
  EXPECT_EQ(dumps, 1);
}

// A user's job dumps are announced under its uid: another node dumps that uid's job of the
// name, never root's; and the user's dump rate bounds what it can make the nodes write.
TEST_F(ClusterTest, AnotherUidsJobDumpTouchesOnlyItsOwnJobAndIsRateLimited) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setpriv)";
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b, "limits { per_uid { dumps_per_minute: 1 dump_burst: 2 } }\n");
  if (HasFatalFailure()) return;
  auto on_b = Connect(*b);
  auto roots = OneRankGroup(*on_b, 1);
  ASSERT_NE(roots, nullptr);
  // nobody's rank of its job "job" on node A (group g0), held by a client process.
  auto held = ChildProcess::Start({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                   "--clear-groups", COMMD_TEST_CLIENT, "join", "1", "hold"},
                                  {"COMMD_RUNTIME_DIR=" + a->runtime_dir(), "COMMD_JOB_ID=job"});
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE((*held)->WaitForLog("holding", absl::Seconds(30))) << (*held)->Log();
  auto as_nobody = [&](std::vector<std::string> args) {
    args.insert(args.begin(),
                {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 COMMCTL_BINARY, "--runtime-dir", a->runtime_dir()});
    return RunProcess(args, absl::Seconds(30), {"COMMD_JOB_ID=job"});
  };
  for (int i = 0; i < 2; ++i) {
    const ProcessResult r = as_nobody({"dump", "--job", "job"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("dump id "));
  }
  const ProcessResult over = as_nobody({"dump", "--job", "job"});
  EXPECT_EQ(over.exit_code, 1) << over.output;
  EXPECT_THAT(over.output, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(over.output, HasSubstr("limits.per_uid.dumps_per_minute"));
  // Two announcements, both under uid 65534; root's job "job" on node B was never dumped.
  const std::vector<std::string> keys = etcd_->Keys(absl::StrCat(kPrefix, "/dumps/"));
  EXPECT_EQ(keys.size(), 2u);
  for (const std::string& k : keys)
    EXPECT_THAT(k, ::testing::StartsWith(absl::StrCat(kPrefix, "/dumps/65534/job/")));
  absl::SleepFor(absl::Seconds(1));
  EXPECT_FALSE(std::filesystem::exists(DumpDir(*b) + "/job")) << b->Log();
  EXPECT_EQ(MetricValue(*b, "commd_cluster_job_dumps_total{event=\"received\"}"), 2);
}

// Every node's view of the job: each node's watchdog writes its groups' views to etcd on change
// (at most once a second per group), `commctl health --cluster` shows them all, a group that
// leaves takes its view along, a lost lease has them written again, and another uid sees none.
TEST_F(ClusterTest, EveryNodesViewOfTheJobIsPublishedAndHealthClusterShowsIt) {
  DaemonProcess *a = nullptr, *b = nullptr;
  StartTwoNodes(&a, &b, "watchdog { poll_interval_ms: 20 }\n");
  if (HasFatalFailure()) return;
  auto on_a = Connect(*a);
  auto on_b = Connect(*b);
  auto g0 = OneRankGroup(*on_a, 0);
  auto g1 = OneRankGroup(*on_b, 1);
  ASSERT_TRUE(g0 && g1);
  auto health = [&](DaemonProcess& d) {
    return RunProcess(
        {COMMCTL_BINARY, "--runtime-dir", d.runtime_dir(), "health", "--cluster", "--job", "job"});
  };
  // Node A's rank completes 200 more barriers; node B's stays at 1.
  const double writes_before =
      MetricValue(*a, "commd_cluster_progress_writes_total{result=\"ok\"}");
  const absl::Time start = absl::Now();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(g0->Barrier().ok());
  std::string shown;
  EXPECT_TRUE(Eventually([&] {
    shown = health(*b).output;
    return absl::StrContains(shown, "node-a           ok       0:201/201") &&
           absl::StrContains(shown, "node-b           ok       1:1/1");
  })) << shown;
  EXPECT_THAT(shown,
              HasSubstr("GROUP            NODE             STATE    RANKS (GLOBAL:DONE/ENTERED)"));
  // On change, at most once a second per group (plus the first write and the last change;
  // a write is counted when etcd's answer comes back, so read the count once it settled).
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  absl::SleepFor(absl::Seconds(1));
  const double settled = MetricValue(*a, "commd_cluster_progress_writes_total{result=\"ok\"}");
  EXPECT_GE(settled - writes_before, 1);
  EXPECT_LE(settled - writes_before, seconds + 2) << "over " << seconds << " s";
  // No change, no write.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(MetricValue(*a, "commd_cluster_progress_writes_total{result=\"ok\"}"), settled);
  const std::string views = absl::StrCat(kPrefix, "/progress/0/job/g/");
  EXPECT_THAT(etcd_->Keys(views), ::testing::ElementsAre(views + "node-a", views + "node-b"));

  // A lost lease (revoked here): node A registers again and writes its view again.
  const nlohmann::json status = nlohmann::json::parse(StatusJson(*a), nullptr, false);
  const std::string lease = status["cluster"]["lease_id"].get<std::string>();
  const ProcessResult revoke = RunProcess({kEtcdctl, "--endpoints", etcd_->endpoint(), "lease",
                                           "revoke", absl::StrFormat("%x", std::stoll(lease))},
                                          absl::Seconds(30), {"ETCDCTL_API=3"});
  ASSERT_EQ(revoke.exit_code, 0) << revoke.output;
  EXPECT_TRUE(Eventually([&] {
    const auto keys = etcd_->Keys(views);
    return std::find(keys.begin(), keys.end(), views + "node-a") != keys.end() &&
           MetricValue(*a, "commd_cluster_progress_writes_total{result=\"ok\"}") > settled;
  })) << a->Log();

  // Another uid asking for its job of the same name sees no view of this one.
  if (::geteuid() == 0) {
    const ProcessResult theirs = RunProcess(
        {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", COMMCTL_BINARY,
         "--runtime-dir", b->runtime_dir(), "health", "--cluster", "--job", "job"},
        absl::Seconds(30));
    EXPECT_EQ(theirs.exit_code, 0) << theirs.output;
    EXPECT_THAT(theirs.output, HasSubstr("no node has published a view of this job"));
  }
  // Without --job, and on a node without a cluster: clear errors.
  const ProcessResult no_job =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", a->runtime_dir(), "health", "--cluster"});
  EXPECT_EQ(no_job.exit_code, 2) << no_job.output;
  EXPECT_THAT(no_job.output, HasSubstr("health --cluster shows one job: name it with --job J"));
  const ProcessResult alone = CommctlWithoutACluster({"health", "--cluster", "--job", "job"});
  EXPECT_EQ(alone.exit_code, 1) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("FAILED_PRECONDITION: this daemon is not in a cluster"));

  // The group leaves node B: its view goes from etcd.
  g1.reset();
  on_b.reset();
  EXPECT_TRUE(Eventually([&] {
    return etcd_->Keys(views) == std::vector<std::string>{views + "node-a"};
  })) << absl::StrJoin(etcd_->Keys(views), ", ");

  // One read of the cluster's views in flight per uid: with etcd paused, the first read waits
  // (up to call_timeout_ms) and a second one meanwhile is refused at once, so the daemon
  // buffers at most one answer per uid. Which of the two reaches the daemon first is up to the
  // scheduler: one of them is refused.
  etcd_->Pause(true);
  ProcessResult first;
  std::thread first_thread([&] { first = health(*b); });
  absl::SleepFor(absl::Milliseconds(300));
  const ProcessResult second = health(*b);
  first_thread.join();
  etcd_->Pause(false);
  const std::string refused =
      "RESOURCE_EXHAUSTED: uid 0 has a read of the cluster's views in flight already; one at a "
      "time per uid";
  EXPECT_TRUE(absl::StrContains(first.output, refused) || absl::StrContains(second.output, refused))
      << first.output << "\n"
      << second.output;
}

// TLS to etcd with client certificates (etcd --client-cert-auth): a node with the CA and a
// client certificate connects and its job store works; a node speaking plain gRPC, or TLS
// without a client certificate, stays disconnected and serves its node; a TLS file that cannot
// be read stops the daemon naming it.
TEST_F(ClusterTest, TlsToEtcdWithClientCertificates) {
  auto files = MakeTlsFiles(tmp_.path());
  ASSERT_TRUE(files.ok()) << files.status();
  etcd_->UseTls(*files);
  ASSERT_EQ(etcd_->Start(), absl::OkStatus());
  const std::string tls =
      absl::StrCat("  tls { enabled: true ca_file: \"", files->ca, "\" cert_file: \"",
                   files->client_cert, "\" key_file: \"", files->client_key, "\" }\n");
  DaemonProcess* a = StartNode("node-a", "", tls);
  DaemonProcess* plain = StartNode("node-plain");
  DaemonProcess* anonymous = StartNode(
      "node-anon", "", absl::StrCat("  tls { enabled: true ca_file: \"", files->ca, "\" }\n"));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(anonymous, nullptr);
  ASSERT_TRUE(Eventually([&] { return Connected(*a); }));
  auto client = Connect(*a);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->store().Set("over-tls", "v").ok());
  EXPECT_THAT(etcd_->Keys(kPrefix), ::testing::Contains(HasSubstr("over-tls")));
  EXPECT_THAT(etcd_->Keys(kPrefix), ::testing::Contains(NodeKey("node-a")));
  // Several retries later the other two are still out, and still serve their node.
  absl::SleepFor(absl::Seconds(2));
  for (DaemonProcess* d : {plain, anonymous}) {
    EXPECT_EQ(MetricValue(*d, "commd_cluster_connected"), 0);
    EXPECT_THAT(StatusJson(*d), HasSubstr("disconnected"));
    auto c = Connect(*d);
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(LocalGroupWorks(*c, "local").ok());
    const absl::Status set = c->store().Set("k", "v");
    EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
    EXPECT_THAT(set.message(), HasSubstr(etcd_->endpoint()));
  }
  EXPECT_THAT(etcd_->Keys(kPrefix), ::testing::Not(::testing::Contains(NodeKey("node-plain"))));
  // A missing key file: the daemon does not start, and says which file.
  TempDir dir("commd-node");
  auto bad = StartDaemonWithConfig(
      dir, absl::StrCat("cluster { etcd_endpoints: \"", etcd_->endpoint(),
                        "\" tls { enabled: true cert_file: \"", files->client_cert,
                        "\" key_file: \"", tmp_.Join("none.key"), "\" } }\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr(absl::StrCat("cluster.tls.key_file \"", tmp_.Join("none.key"),
                                     "\" cannot be read: No such file or directory")));
}

}  // namespace
}  // namespace commd::testing
