// Per-job series on the real daemon's /metrics: two jobs each run a group named "tp" with
// real rank processes (watchdog_rank); job a's hangs and is aborted, job b's idles healthy.
// Every per-group series names its job, one job's state never masks the other's, and when
// job a's group retires only its own gauges go while its counters keep their final values.
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

class JobMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = StartDaemonWithConfig(tmp_, "watchdog { poll_interval_ms: 20 }\n");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }

  // Two ranks of group tp of `job`, running watchdog_rank's SCENARIO.
  std::vector<std::unique_ptr<ChildProcess>> Ranks(const std::string& job, int timeout_ms,
                                                   const std::string& scenario, int n, int odd) {
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int r = 0; r < 2; ++r) {
      auto c = ChildProcess::Start(
          {WATCHDOG_RANK, "tp", std::to_string(r), "2", "notify", std::to_string(timeout_ms),
           scenario, std::to_string(n), std::to_string(odd)},
          {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=" + job});
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) ranks.push_back(std::move(*c));
    }
    return ranks;
  }

  std::map<std::string, double> Metrics() {
    auto m = Scrape(*daemon_);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : std::map<std::string, double>{};
  }

  // Scrapes until `done` holds for the parsed /metrics (a minute at most); returns the last.
  template <typename Pred>
  std::map<std::string, double> MetricsWhen(const std::string& what, Pred done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    std::map<std::string, double> m = Metrics();
    while (!done(m) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      m = Metrics();
    }
    EXPECT_TRUE(done(m)) << "never: " << what;
    return m;
  }

  static double At(const std::map<std::string, double>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? -1 : it->second;
  }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

std::string State(const std::string& job, const std::string& state) {
  return absl::StrCat(R"(commd_group_state{group="tp",job=")", job, R"(",state=")", state, R"("})");
}

TEST_F(JobMetricsTest, SameGroupNameInTwoJobsKeepsSeparateSeries) {
  // Job a: rank 1 never enters collective 3, so the watchdog finds a lagging hang after 1 s
  // and aborts the group (policy notify); rank 0 then exits, rank 1 sleeps on.
  auto a = Ranks("a", 1000, "lag", 3, 1);
  // Job b: a group of the same name that idles, healthy, heartbeating.
  auto b = Ranks("b", 60000, "idle", 0, 0);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (auto& r : b) ASSERT_TRUE(r->WaitForLog("IDLE", absl::Seconds(60))) << r->Log();
  ASSERT_TRUE(a[0]->WaitForLog("ABORTED", absl::Seconds(60))) << a[0]->Log();

  // The state turns "aborted" when the watchdog decides; the abort's counter moves when the
  // abort has been sent, a moment later: wait for both.
  const std::string a_aborts = R"(commd_aborts_total{group="tp",job="a",reason="lagging"})";
  auto m = MetricsWhen("job a aborted and job b ok in one scrape", [&](const auto& m) {
    return At(m, State("a", "aborted")) == 1 && At(m, a_aborts) == 1 &&
           At(m, State("b", "ok")) == 1;
  });
  for (const char* s : {"ok", "suspect", "hung"}) EXPECT_EQ(At(m, State("a", s)), 0) << s;
  for (const char* s : {"suspect", "hung", "aborted"}) EXPECT_EQ(At(m, State("b", s)), 0) << s;
  EXPECT_EQ(At(m, R"(commd_hangs_detected_total{group="tp",job="a",kind="lagging"})"), 1);
  for (const auto& [key, value] : m) {
    // Nothing is found or aborted in job b, and no per-group series lacks its job.
    EXPECT_FALSE(absl::StartsWith(key, "commd_hangs_detected_total") &&
                 absl::StrContains(key, R"(job="b")"))
        << key;
    EXPECT_FALSE(absl::StartsWith(key, "commd_aborts_total") &&
                 absl::StrContains(key, R"(job="b")"))
        << key;
    if (absl::StrContains(key, R"(group=")")) {
      EXPECT_TRUE(absl::StrContains(key, "job=")) << key;
    }
  }
  for (const char* job : {"a", "b"}) {
    for (int rank : {0, 1}) {
      EXPECT_GT(At(m, absl::StrCat(R"(commd_rank_last_progress_timestamp_seconds{group="tp",job=")",
                                   job, R"(",rank=")", rank, R"("})")),
                1.7e9)
          << job << " rank " << rank;
    }
  }

  // Job a's group retires once its sleeping rank is gone too.
  ASSERT_TRUE(a[1]->Stop(SIGKILL).ok());
  ASSERT_TRUE(a[0]->Wait(absl::Seconds(30)).ok());
  m = MetricsWhen("job a's state gone", [](const auto& m) {
    for (const auto& [key, value] : m) {
      if (absl::StartsWith(key, "commd_group_state{") && absl::StrContains(key, R"(job="a")")) {
        return false;
      }
    }
    return true;
  });
  // Job b's series of the same group name stay, still healthy.
  EXPECT_EQ(At(m, State("b", "ok")), 1);
  EXPECT_GT(At(m, R"(commd_rank_last_progress_timestamp_seconds{group="tp",job="b",rank="1"})"),
            1.7e9);
  EXPECT_EQ(At(m, R"(commd_flight_recorder_entries_total{group="tp",job="b"})"), 0);
  // Job a's gauges went; its counters keep their final values: 2 completed all-reduces of
  // 1024 floats per rank, 3 entries on rank 0 (it entered the third) and 2 on rank 1.
  EXPECT_EQ(At(m, R"(commd_rank_last_progress_timestamp_seconds{group="tp",job="a",rank="0"})"),
            -1);
  EXPECT_EQ(At(m, R"(commd_hangs_detected_total{group="tp",job="a",kind="lagging"})"), 1);
  EXPECT_EQ(At(m, R"(commd_collectives_total{group="tp",job="a",op="all_reduce"})"), 4);
  EXPECT_EQ(At(m, R"(commd_collective_bytes_total{group="tp",job="a"})"), 4 * 1024 * 4);
  EXPECT_EQ(At(m, R"(commd_flight_recorder_entries_total{group="tp",job="a"})"), 5);
  EXPECT_EQ(At(m, R"(commd_nan_detected_total{group="tp",job="a"})"), 0);
}

}  // namespace
}  // namespace commd::testing
