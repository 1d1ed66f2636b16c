// Per-uid shares of the daemon's limits (limits.per_uid) against the real daemon, with client
// processes run as different uids (setpriv): for every share, one uid at its limit hears
// RESOURCE_EXHAUSTED naming the field, a second job id of the same uid does not escape it,
// and another uid is still fully served. And control blocks cost the daemon nothing: joins
// up to the control-block share leave its RSS flat.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Small shares, so that each is reached with a few calls; the global limits stay at their
// defaults, far above. uid 1001 is the one at its limits, 1002 the bystander.
constexpr char kConfig[] = R"(socket_group: "nogroup"
limits {
  per_uid {
    groups_forming: 4
    allocations: 12
    host_bytes: 1048576
    control_blocks: 8
    persistent_buffers: 4
    persistent_bytes: 65536
    store_keys: 8
    store_bytes: 4096
    dumps_per_minute: 1
    dump_burst: 2
    dump_bytes: 1
  }
}
recorder { ring_capacity: 16 dump_dir: "$DUMPS" }
)";

class PerUidLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids (setpriv)";
    // Other uids must reach the sockets: they may search the test's dir, and the daemon gives
    // its runtime dir and sockets to group nogroup, which the clients run in.
    ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
    auto d = StartDaemonWithConfig(tmp_,
                                   absl::StrReplaceAll(config(), {{"$DUMPS", tmp_.Join("dumps")}}));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  virtual std::string config() const { return kConfig; }

  std::vector<std::string> Command(int uid, std::vector<std::string> args) const {
    args.insert(args.begin(), {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid), "--regid=65534",
                               "--clear-groups", COMMD_TEST_CLIENT});
    return args;
  }
  std::vector<std::string> Env(const std::string& job) const {
    return {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=" + job};
  }
  // Runs the test client as `uid` in `job` to its end; returns what it printed.
  std::string As(int uid, std::vector<std::string> args, const std::string& job = "job") {
    return RunProcess(Command(uid, std::move(args)), absl::Seconds(60), Env(job)).output;
  }
  // Starts it and waits until it holds what it made ("holding").
  std::unique_ptr<ChildProcess> Holding(int uid, std::vector<std::string> args,
                                        const std::string& job = "job") {
    args.push_back("hold");
    auto child = ChildProcess::Start(Command(uid, std::move(args)), Env(job));
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return nullptr;
    EXPECT_TRUE((*child)->WaitForLog("holding", absl::Seconds(60))) << (*child)->Log();
    return *std::move(child);
  }
  double Metric(const std::string& key) const { return MetricValue(*daemon_, key); }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(PerUidLimitsTest, PersistentBuffers) {
  EXPECT_THAT(As(1001, {"persistent", "5", "4096"}),
              HasSubstr("ok 4\nfailed 4 RESOURCE_EXHAUSTED uid 1001 holds 4 of its 4 persistent "
                        "buffers (limits.per_uid.persistent_buffers)"));
  // They outlive the process, and a fresh job id is no way around the share.
  EXPECT_THAT(As(1001, {"persistent", "1", "4096"}, "another-job"),
              HasSubstr("failed 0 RESOURCE_EXHAUSTED uid 1001 holds 4 of its 4 persistent "));
  EXPECT_THAT(As(1002, {"persistent", "4", "4096"}), HasSubstr("ok 4\n"));
  EXPECT_THAT(As(1002, {"persistent", "1", "4096"}, "another-job"),
              HasSubstr("failed 0 RESOURCE_EXHAUSTED uid 1002 holds 4 of its 4 persistent"));
  // Bytes: 64 KiB in persistent buffers per uid.
  EXPECT_THAT(As(1003, {"persistent", "2", "40000"}),
              HasSubstr("ok 1\nfailed 1 RESOURCE_EXHAUSTED uid 1003 holds 40 KiB of its 64 KiB in "
                        "persistent buffers; 39.1 KiB (40000 bytes) more would exceed it "
                        "(limits.per_uid.persistent_bytes)"));
  EXPECT_EQ(Metric("commd_allocations{backend=\"host\",lifetime=\"PERSISTENT\"}"), 9);
}

TEST_F(PerUidLimitsTest, StoreKeysAndBytes) {
  EXPECT_THAT(As(1001, {"store-fill", "9", "10"}),
              HasSubstr("ok 8\nfailed 8 RESOURCE_EXHAUSTED uid 1001 holds 8 of its 8 store keys "
                        "(limits.per_uid.store_keys)"));
  EXPECT_THAT(As(1001, {"store-fill", "1", "10"}, "another-job"),
              HasSubstr("failed 0 RESOURCE_EXHAUSTED uid 1001 holds 8 of its 8 store keys"));
  // The same job name under another uid is another user's: fully served.
  EXPECT_THAT(As(1002, {"store-fill", "8", "10"}), HasSubstr("ok 8\n"));
  EXPECT_THAT(As(1002, {"store-get", "k7"}), HasSubstr("got OK vvvvvvvvvv"));
  EXPECT_THAT(As(1003, {"store-fill", "2", "3000"}),
              HasSubstr("ok 1\nfailed 1 RESOURCE_EXHAUSTED uid 1003 holds 3002 of its 4096 bytes "
                        "of store; 3002 more would exceed it (limits.per_uid.store_bytes)"));
  EXPECT_THAT(As(1003, {"store-fill", "1", "2000"}, "another-job"),
              HasSubstr("failed 0 RESOURCE_EXHAUSTED uid 1003 holds 3002 of its 4096 bytes"));
}

TEST_F(PerUidLimitsTest, GroupsInRendezvous) {
  auto forming = ChildProcess::Start(Command(1001, {"forming", "4", "60000"}), Env("job"));
  ASSERT_TRUE(forming.ok());
  for (int i = 0; i < 1000 && Metric("commd_groups") < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Metric("commd_groups"), 4) << (*forming)->Log();
  EXPECT_THAT(As(1001, {"forming", "1", "60000"}, "another-job"),
              HasSubstr("join 0 RESOURCE_EXHAUSTED uid 1001 holds 4 of its 4 groups in rendezvous "
                        "(limits.per_uid.groups_forming)"));
  // Another uid still gets rendezvous slots: its lone rank waits for its peer (and times out
  // for want of one), and a group of one forms.
  const std::string other = As(1002, {"forming", "1", "300"});
  EXPECT_THAT(other, HasSubstr("join 0 DEADLINE_EXCEEDED"));
  EXPECT_THAT(other, Not(HasSubstr("RESOURCE_EXHAUSTED")));
  EXPECT_THAT(As(1002, {"join", "1"}), HasSubstr("ok 1\n"));
}

TEST_F(PerUidLimitsTest, AllocationsAndHostBytes) {
  // One control block and 11 symmetric buffers make its 12 allocations.
  auto holder = Holding(1001, {"alloc", "20", "4096"});
  ASSERT_NE(holder, nullptr);
  EXPECT_THAT(holder->Log(), HasSubstr("ok 11\nfailed 11 RESOURCE_EXHAUSTED uid 1001 holds 12 of "
                                       "its 12 allocations (limits.per_uid.allocations)"));
  EXPECT_THAT(As(1001, {"join", "1"}, "another-job"),
              HasSubstr("failed 0 RESOURCE_EXHAUSTED uid 1001 holds 12 of its 12 allocations"));
  auto other = Holding(1002, {"alloc", "11", "4096"});
  ASSERT_NE(other, nullptr);
  EXPECT_THAT(other->Log(), HasSubstr("ok 11\n"));
  // Host bytes (1 MiB): the control block's 16 KiB is charged too.
  const std::string big = As(1003, {"alloc", "1", "2000000"});
  EXPECT_THAT(big, HasSubstr("failed 0 RESOURCE_EXHAUSTED uid 1003 holds 16 KiB of its 1 MiB of "
                             "host memory; "));
  EXPECT_THAT(big, HasSubstr("(limits.per_uid.host_bytes)"));
}

TEST_F(PerUidLimitsTest, DumpRateAndBytes) {
  auto dumper = Holding(1001, {"dump", "3"});
  ASSERT_NE(dumper, nullptr);
  const std::string log = dumper->Log();
  EXPECT_THAT(log, HasSubstr("ok 2\nfailed 2 RESOURCE_EXHAUSTED uid 1001 made its 2 dumps allowed "
                             "at once, refilled at 1 a minute"));
  EXPECT_THAT(log, HasSubstr("(limits.per_uid.dumps_per_minute, limits.per_uid.dump_burst)"));
  EXPECT_EQ(Metric("commd_flight_recorder_dumps_refused_total{trigger=\"request\"}"), 1);
  EXPECT_TRUE(daemon_->WaitForLog("request dump refused: uid 1001", absl::Seconds(5)));
  // dump_bytes 1: each new dump of a uid deletes its older ones, and only its own.
  std::vector<std::string> dirs;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::ConsumePrefix(&line, "dumped ")) dirs.emplace_back(line);
  }
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(dirs[0]));
  EXPECT_TRUE(std::filesystem::exists(dirs[1]));
  auto other = Holding(1002, {"dump", "1"});
  ASSERT_NE(other, nullptr);
  EXPECT_THAT(other->Log(), HasSubstr("ok 1\n"));
  EXPECT_TRUE(std::filesystem::exists(dirs[1])) << "another uid's dump evicted uid 1001's";
  EXPECT_EQ(Metric("commd_flight_recorder_dumps_evicted_total"), 1);
}

// VmRSS or RssShmem of a process, in KiB.
long StatusKib(pid_t pid, absl::string_view field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, field) && absl::ConsumePrefix(&v, ":")) {
      long kib = -1;
      v = absl::StripSuffix(absl::StripAsciiWhitespace(v), "kB");
      return absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kib) ? kib : -1;
    }
  }
  return -1;
}

// At the default ring capacity each control block is 3.4 MiB; 64 of them would be 216 MiB of
// the daemon's RSS if it touched their pages.
class ControlBlockCostTest : public PerUidLimitsTest {
 protected:
  std::string config() const override {
    return R"(socket_group: "nogroup"
limits { per_uid { control_blocks: 64 } }
recorder { ring_capacity: 4096 })";
  }
};

TEST_F(ControlBlockCostTest, JoinsUpToTheShareLeaveTheDaemonsRssFlat) {
  // A first group's whole life, so the baseline holds what the daemon allocates once.
  EXPECT_THAT(As(1002, {"join", "1"}), HasSubstr("ok 1\n"));
  const long rss_before = StatusKib(daemon_->pid(), "VmRSS");
  const long shmem_before = StatusKib(daemon_->pid(), "RssShmem");
  ASSERT_GT(rss_before, 0);
  auto holder = Holding(1001, {"join", "65"});
  ASSERT_NE(holder, nullptr);
  EXPECT_THAT(holder->Log(), HasSubstr("ok 64\nfailed 64 RESOURCE_EXHAUSTED uid 1001 holds 64 of "
                                       "its 64 control blocks (limits.per_uid.control_blocks)"));
  EXPECT_EQ(Metric("commd_groups"), 64);
  // Let the watchdog poll them and a scrape read their counters, as it does all day.
  absl::SleepFor(absl::Milliseconds(500));
  const long rss_after = StatusKib(daemon_->pid(), "VmRSS");
  const long shmem_after = StatusKib(daemon_->pid(), "RssShmem");
  // A page or two of each block's header is read; 216 MiB of rings would not fit in 16 MiB.
  EXPECT_LT(shmem_after - shmem_before, 4 * 1024) << shmem_before << " -> " << shmem_after;
  EXPECT_LT(rss_after - rss_before, 16 * 1024) << rss_before << " -> " << rss_after;
  // Another uid joins as ever.
  EXPECT_THAT(As(1002, {"join", "1"}, "other"), HasSubstr("ok 1\n"));
}

}  // namespace
}  // namespace commd::testing
