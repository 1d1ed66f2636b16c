// What happens when a rank's process ends, against the real daemon and real rank processes
// (death_rank.cc): a finished job closes its sessions and leaves no dump; a rank that dies
// mid-collective releases its peers at once with ABORTED naming it, its pid and how it ended,
// under the default policy (report), and the death is dumped once.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr int kWorld = 4;

class RankDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A fast watchdog, so that if it were to call the survivors hung it would do so within
    // the test; the groups' own timeout is 10 minutes (death_rank.cc).
    auto d = StartDaemonWithConfig(tmp_, "watchdog { poll_interval_ms: 20 }",
                                   {"--dump-dir", tmp_.Join("dumps")});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }

  void Ranks(const std::string& policy, const std::string& scenario, int victim) {
    for (int r = 0; r < kWorld; ++r) {
      auto c = ChildProcess::Start(
          {DEATH_RANK, std::to_string(r), std::to_string(kWorld), policy, scenario,
           std::to_string(victim)},
          {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "DEATH_RANK_GO=" + tmp_.Join("go")});
      ASSERT_TRUE(c.ok()) << c.status();
      ranks_.push_back(std::move(*c));
    }
  }

  // The survivors' two failures, each with `code` and `death` in its message, and a clean exit.
  void ExpectSurvivorsFailed(
      int victim, const ::testing::Matcher<const std::string&>& death,
      const std::string& code = "ABORTED: group d aborted because a rank of the group died: ") {
    for (int r = 0; r < kWorld; ++r) {
      if (r == victim) continue;
      SCOPED_TRACE(absl::StrCat("rank ", r));
      // Far inside the 10-minute group timeout: only the death can have ended the wait.
      auto result = ranks_[r]->Wait(absl::Seconds(60));
      ASSERT_TRUE(result.ok()) << result.status() << "\n" << ranks_[r]->Log();
      EXPECT_EQ(result->exit_code, 0) << result->output;
      EXPECT_THAT(result->output, HasSubstr("FAILED " + code));
      EXPECT_THAT(result->output, HasSubstr("LATER " + code));
      for (const char* line : {"FAILED", "LATER"}) {
        const size_t at = result->output.find(line);
        ASSERT_NE(at, std::string::npos);
        const std::string text = result->output.substr(at, result->output.find('\n', at) - at);
        EXPECT_THAT(text, death);
      }
    }
  }

  // Waits until no session is open, then returns the released counts by reason.
  std::pair<double, double> ClosedAndExited() {
    for (int i = 0; i < 500 && Metric("commd_sessions") != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(Metric("commd_sessions"), 0);
    return {Metric(R"(commd_sessions_released_total{reason="closed"})"),
            Metric(R"(commd_sessions_released_total{reason="process_exited"})")};
  }

  // Dump directories (dumps/job/<time>-<trigger>) and the rank files in each.
  std::map<std::string, int> Dumps() {
    std::map<std::string, int> out;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(tmp_.Join("dumps"), ec);
         !ec && it != fs::end(it); it.increment(ec)) {
      if (it->path().extension() != ".json") continue;
      // .../dumps/job/<time>-<trigger>/d/rank<N>.json
      ++out[it->path().parent_path().parent_path().filename().string()];
    }
    return out;
  }

  // Waits until one dump holds every rank's file; then expects it to be the only one.
  void ExpectOneDeathDump() {
    std::map<std::string, int> dumps;
    for (int i = 0; i < 500; ++i) {
      dumps = Dumps();
      if (!dumps.empty() && dumps.begin()->second == kWorld) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(dumps.size(), 1u) << ::testing::PrintToString(dumps);
    EXPECT_THAT(dumps.begin()->first, ::testing::EndsWith("-rank_death"));
    EXPECT_EQ(dumps.begin()->second, kWorld);
    EXPECT_EQ(Metric(R"(commd_flight_recorder_dumps_total{trigger="rank_death"})"), 1);
  }

  // Waits for the victim, which ends by itself, to exit with `code`; returns its pid.
  pid_t WaitForVictim(int victim, int code) {
    const pid_t pid = ranks_[victim]->pid();
    auto result = ranks_[victim]->Wait(absl::Seconds(60));
    EXPECT_TRUE(result.ok()) << result.status();
    if (result.ok()) EXPECT_EQ(result->exit_code, code) << result->output;
    return pid;
  }

  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::vector<std::unique_ptr<ChildProcess>> ranks_;
};

TEST_F(RankDeathTest, FinishedJobClosesItsSessionsAndLeavesNoDump) {
  Ranks("default", "clean", -1);
  for (auto& r : ranks_) {
    auto result = r->Wait(absl::Seconds(120));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 0) << result->output;
    EXPECT_THAT(result->output, HasSubstr("DONE"));
  }
  const auto [closed, exited] = ClosedAndExited();
  EXPECT_EQ(closed, kWorld);
  EXPECT_EQ(exited, 0);
  // The group retires with its last member; a poll or two later nothing could still dump.
  for (int i = 0; i < 50 && Metric("commd_groups") != 0; ++i)
    absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(Dumps().empty()) << ::testing::PrintToString(Dumps());
  EXPECT_EQ(Metric(R"(commd_flight_recorder_dumps_total{trigger="rank_death"})"), 0);
  EXPECT_EQ(Metric(R"(commd_hangs_detected_total{kind="dead"})"), 0);
}

TEST_F(RankDeathTest, KilledRankAbortsPendingAndLaterCollectivesUnderReport) {
  Ranks("report", "kill", 2);
  ASSERT_TRUE(ranks_[2]->WaitForLog("VICTIM", absl::Seconds(60))) << ranks_[2]->Log();
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(ranks_[r]->WaitForLog("WAITING", absl::Seconds(60))) << ranks_[r]->Log();
  }
  // Usually lets the survivors enter the all-reduce's wait; the outcome is the same if not.
  absl::SleepFor(absl::Milliseconds(300));
  const pid_t victim = ranks_[2]->pid();
  ASSERT_TRUE(ranks_[2]->Stop(SIGKILL).ok());
  ExpectSurvivorsFailed(
      2, HasSubstr(absl::StrCat("rank 2 (pid ", victim, ") exited: killed by SIGKILL")));
  ExpectOneDeathDump();
  const auto [closed, exited] = ClosedAndExited();
  EXPECT_EQ(closed, kWorld - 1);  // the survivors finished normally
  EXPECT_EQ(exited, 1);
  EXPECT_EQ(Metric(R"(commd_hangs_detected_total{kind="dead"})"), 1);
  EXPECT_EQ(Metric(R"(commd_aborts_total{reason="peer_dead"})"), 1);
  // Aborted survivors are not then called hung (stuck, lagging, unresponsive) as well.
  absl::SleepFor(absl::Milliseconds(200));
  for (const char* kind : {"stuck", "lagging", "mismatch", "unresponsive"}) {
    EXPECT_EQ(Metric(absl::StrCat(R"(commd_hangs_detected_total{kind=")", kind, R"("})")), 0)
        << kind;
  }
  EXPECT_EQ(Dumps().size(), 1u);
}

TEST_F(RankDeathTest, RankExitingWithStatus3IsNamedSo) {
  Ranks("report", "exit3", 1);
  const pid_t victim = WaitForVictim(1, 3);
  ExpectSurvivorsFailed(1,
                        HasSubstr(absl::StrCat("rank 1 (pid ", victim, ") exited with status 3")));
  ExpectOneDeathDump();
}

// The SDK closes its session when the Client is destroyed; a process that exits 0 without
// doing so, while its group's peers may still need it, is a death like any other exit.
TEST_F(RankDeathTest, ExitWithStatus0WithoutClosingIsADeathForThePeers) {
  Ranks("report", "exit0", 3);
  const pid_t victim = WaitForVictim(3, 0);
  ExpectSurvivorsFailed(3,
                        HasSubstr(absl::StrCat("rank 3 (pid ", victim, ") exited with status 0")));
  ExpectOneDeathDump();
}

// A rank that closed its session and then exited is no death: no abort, no dump. A peer's
// wait on it gives up at its own deadline, naming it as exited rather than "not arrived".
TEST_F(RankDeathTest, PeerThatClosedAndExitedIsNamedWhenAWaitTimesOut) {
  Ranks("report", "leave", 1);
  const pid_t victim = WaitForVictim(1, 0);
  std::ofstream(tmp_.Join("go")) << "go";
  // Closed and exited: named without an exit status. A survivor whose own wait ended first
  // may have exited too by the time a slower one's wait ends, and is then listed after it.
  ExpectSurvivorsFailed(
      1, ::testing::ContainsRegex(absl::StrCat("rank 1 \\(pid ", victim, "\\) exited(,| \\()")),
      "DEADLINE_EXCEEDED: group d: ");
  EXPECT_EQ(Metric(R"(commd_flight_recorder_dumps_total{trigger="rank_death"})"), 0);
  const auto [closed, exited] = ClosedAndExited();
  EXPECT_EQ(closed, kWorld);
  EXPECT_EQ(exited, 0);
}

}  // namespace
}  // namespace commd::testing
