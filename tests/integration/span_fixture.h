// The fixture of the tests of groups that span nodes (span_test, span_abort_test): a real etcd
// on loopback, real daemons as nodes (StartNodes), real rank processes (span_rank, or
// span_collective_rank with a mode) joining one group from several nodes, and the checks that
// nothing is left behind. The including test defines SPAN_RANK and SPAN_COLLECTIVE_RANK.
//
//   class SpanTest : public SpanFixture {};
//   TEST_F(SpanTest, X) {
//     std::vector<DaemonProcess*> n;
//     StartNodes({"node-a", "node-b"}, &n);
//     if (HasFatalFailure()) return;
//     Run({{.node = n[0], .global_rank = 0, .global_world = 2}, {.node = n[1], ...}});
//   }
#ifndef COMMD_TESTS_INTEGRATION_SPAN_FIXTURE_H_
#define COMMD_TESTS_INTEGRATION_SPAN_FIXTURE_H_

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "commd/commd.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/etcd_process.h"

namespace commd::testing {

inline constexpr char kPrefix[] = "/commd-test";

// One rank process: which node, its node-local and global place, its job and group.
struct RankSpec {
  const DaemonProcess* node = nullptr;
  int rank = 0;
  int world = 1;
  int global_rank = 0;
  int global_world = 1;
  int timeout_ms = 30000;
  std::string group = "g";
  std::string job = "job";
  bool as_nobody = false;  // run as uid 65534 (needs root)
  // span_collective_rank and its mode instead of span_rank.
  std::string mode;
  std::vector<std::string> env;  // "NAME=value", added to the rank's environment
};

// The first line of `log` starting with `prefix`, or "" when there is none.
inline std::string Line(const std::string& log, const std::string& prefix) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StartsWith(line, prefix)) return std::string(line);
  }
  return "";
}

class SpanFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kEtcd, X_OK) != 0) {
      GTEST_SKIP() << kEtcd << " is missing: install Debian's etcd-server (scripts/install-deps)";
    }
    ::chmod(tmp_.path().c_str(), 0755);  // the leave file, for ranks of another uid
    etcd_ = std::make_unique<Etcd>(tmp_.Join("etcd"));
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& r : ranks_) std::cerr << "--- rank " << r->pid() << ":\n" << r->Log();
      for (const auto& d : daemons_) {
        std::cerr << "--- daemon " << d->runtime_dir() << ":\n" << d->Log();
      }
    }
    LeaveAll();
    ranks_.clear();
    daemons_.clear();
    if (etcd_ != nullptr) etcd_->Kill();
  }

  // A daemon named `node` on its own runtime dir, pointed at the test's etcd (or, with
  // `endpoint`, elsewhere); no cluster at all with `clustered` false.
  DaemonProcess* StartNode(const std::string& node, const std::string& extra_config = "",
                           const std::string& endpoint = "", bool clustered = true) {
    auto dir = std::make_unique<TempDir>("commd-node");
    ::chmod(dir->path().c_str(), 0755);  // another uid's client may reach the sockets
    std::string config = "socket_group: \"nogroup\"\n";
    if (clustered) {
      absl::StrAppend(&config, "cluster {\n  etcd_endpoints: \"",
                      endpoint.empty() ? etcd_->endpoint() : endpoint, "\"\n  node_name: \"", node,
                      "\"\n  prefix: \"", kPrefix, "\"\n  lease_ttl_ms: ", lease_ttl_ms_,
                      "\n  job_lease_ttl_ms: 2000\n  call_timeout_ms: 2000\n"
                      "  retry_initial_ms: 50\n  retry_max_ms: 400\n}\n");
    }
    absl::StrAppend(&config, extra_config);
    auto d = StartDaemonWithConfig(*dir, config);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    dirs_.push_back(std::move(dir));
    daemons_.push_back(std::move(*d));
    return daemons_.back().get();
  }
  // etcd and `names.size()` nodes connected to it (ASSERT inside: check HasFatalFailure after).
  // The nodes' lease TTL (ms) for the nodes started after it is set: 2 s, so that a killed
  // node is gone soon; a test that needs the cluster to outlast a slow etcd sets more (a lease
  // keep-alive waits at most a third of it).
  std::string lease_ttl_ms_ = "2000";
  void StartNodes(const std::vector<std::string>& names, std::vector<DaemonProcess*>* nodes,
                  const std::string& extra_config = "") {
    ASSERT_EQ(etcd_->Start(), absl::OkStatus());
    for (const std::string& name : names) {
      DaemonProcess* d = StartNode(name, extra_config);
      ASSERT_NE(d, nullptr);
      nodes->push_back(d);
    }
    // Connected, and watching what the other nodes announce (a watch sees what comes after it
    // opened; the watch of <prefix>/nodes/ opens alike, without a gauge of its own).
    ASSERT_TRUE(Eventually([&] {
      for (DaemonProcess* d : *nodes) {
        if (MetricValue(*d, "commd_cluster_connected") != 1 ||
            MetricValue(*d, "commd_cluster_job_dumps_watching") != 1 ||
            MetricValue(*d, "commd_cluster_span_aborts_watching") != 1) {
          return false;
        }
      }
      return true;
    }));
  }

  ChildProcess* StartRank(const RankSpec& s) {
    std::vector<std::string> argv = {s.mode.empty() ? SPAN_RANK : SPAN_COLLECTIVE_RANK,
                                     s.group,
                                     absl::StrCat(s.rank),
                                     absl::StrCat(s.world),
                                     absl::StrCat(s.global_rank),
                                     absl::StrCat(s.global_world),
                                     absl::StrCat(s.timeout_ms),
                                     LeaveFile()};
    if (!s.mode.empty()) argv.push_back(s.mode);
    if (s.as_nobody) {
      argv.insert(argv.begin(),
                  {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
    }
    // Gloo between the nodes' leaders listens on loopback (all nodes are this machine).
    std::vector<std::string> env = {"COMMD_RUNTIME_DIR=" + s.node->runtime_dir(),
                                    "COMMD_JOB_ID=" + s.job, "COMMD_GLOO_IFACE=lo"};
    env.insert(env.end(), s.env.begin(), s.env.end());
    auto p = ChildProcess::Start(argv, env);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    ranks_.push_back(std::move(*p));
    return ranks_.back().get();
  }
  // What each rank printed once its join returned ("joined" or "join <CODE> ...").
  std::vector<std::string> Run(const std::vector<RankSpec>& specs) {
    std::vector<ChildProcess*> started;
    for (const RankSpec& s : specs) started.push_back(StartRank(s));
    std::vector<std::string> logs;
    for (ChildProcess* p : started) {
      if (p == nullptr) {
        logs.push_back("");
        continue;
      }
      EXPECT_TRUE(p->WaitForLog("join", absl::Seconds(60))) << p->Log();
      // A failed join's line is complete once the process exits; a joined rank's "joined"
      // comes last.
      if (!p->WaitForLog("joined", absl::Milliseconds(1))) (void)p->Wait(absl::Seconds(30));
      logs.push_back(p->Log());
    }
    return logs;
  }
  // 2 nodes x 2 ranks of group `group` running span_collective_rank's `mode`: node n[g / 2],
  // local rank g % 2, global rank g; the group's timeout `timeout_ms`.
  std::vector<ChildProcess*> TwoByTwo(const std::vector<DaemonProcess*>& n, const std::string& mode,
                                      const std::string& group = "g", int timeout_ms = 30000) {
    std::vector<ChildProcess*> ranks;
    for (int g = 0; g < 4; ++g) {
      ranks.push_back(StartRank({.node = n[g / 2],
                                 .rank = g % 2,
                                 .world = 2,
                                 .global_rank = g,
                                 .global_world = 4,
                                 .timeout_ms = timeout_ms,
                                 .group = group,
                                 .mode = mode}));
    }
    return ranks;
  }
  std::string LeaveFile() const { return tmp_.Join("leave"); }
  // Every rank still in its group leaves (and exits).
  void LeaveAll() {
    std::ofstream(LeaveFile()).put('x');
    for (auto& r : ranks_) (void)r->Wait(absl::Seconds(30));
  }
  std::string GroupKeys(const std::string& uid = "0", const std::string& job = "job",
                        const std::string& group = "g") const {
    return absl::StrCat(kPrefix, "/jobs/", uid, "/", job, "/groups/", group, "/nodes/");
  }
  // Nothing of any spanning group in etcd, and no group in any daemon.
  bool NothingLeft() const {
    if (!etcd_->Keys(absl::StrCat(kPrefix, "/jobs/")).empty()) return false;
    for (const auto& d : daemons_) {
      if (MetricValue(*d, "commd_groups") != 0) return false;
    }
    return true;
  }
  std::unique_ptr<Client> Connect(const DaemonProcess& d) {
    auto c = Client::Connect({.runtime_dir = d.runtime_dir(), .job_id = "job"});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDir tmp_{"commd-span"};
  std::unique_ptr<Etcd> etcd_;
  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
  std::vector<std::unique_ptr<ChildProcess>> ranks_;
};

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_SPAN_FIXTURE_H_
