// The watchdog against the real daemon and 4 real rank processes (watchdog_rank.cc): each
// kind of hang injected on purpose, then the diagnosis (GetHealth), the metric, the dump with
// the diagnosis inside, and the policy's action (abort word and event under notify, the
// processes gone under terminate). And no false alarm for fast collectives and a long gap.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr int kWorld = 4;

class WatchdogTest : public ::testing::Test {
 protected:
  void Start(const std::string& watchdog) {
    auto d = StartDaemonWithConfig(
        tmp_, absl::StrCat("watchdog { poll_interval_ms: 20 ", watchdog, " }\n"),
        {"--dump-dir", tmp_.Join("dumps")});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    auto c = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "job"});
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  void Ranks(const std::string& policy, int timeout_ms, const std::string& scenario, int n, int odd,
             int gap_ms = 0, int world = kWorld, int ignores_sigterm = -1) {
    for (int r = 0; r < world; ++r) {
      auto c =
          ChildProcess::Start({WATCHDOG_RANK, "g", std::to_string(r), std::to_string(kWorld),
                               policy, std::to_string(timeout_ms), scenario, std::to_string(n),
                               std::to_string(odd), std::to_string(gap_ms)},
                              {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=job",
                               absl::StrCat("WATCHDOG_RANK_IGNORE_SIGTERM=", ignores_sigterm)});
      ASSERT_TRUE(c.ok()) << c.status();
      ranks_.push_back(std::move(*c));
    }
  }

  void WaitForLog(int rank, const std::string& text) {
    EXPECT_TRUE(ranks_[rank]->WaitForLog(text, absl::Seconds(60)))
        << "rank " << rank << ": " << ranks_[rank]->Log();
  }

  // Polls GetHealth until group g has a diagnosis (or a minute passes).
  v1::GroupHealth WaitForDiagnosis() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    v1::GroupHealth last;
    while (absl::Now() < deadline) {
      auto h = client_->GetHealth("g");
      if (h.ok() && h->groups_size() > 0) {
        last = h->groups(0);
        if (last.has_last_diagnosis()) return last;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "no diagnosis for group g: " << last.DebugString();
    return last;
  }

  // rank<N>.json of the dump with `trigger` (hang-<kind>, rank_death), once all are there.
  std::vector<nlohmann::json> WaitForDump(const std::string& trigger) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      std::vector<nlohmann::json> out;
      std::error_code ec;
      for (auto it = fs::recursive_directory_iterator(tmp_.Join("dumps"), ec);
           !ec && it != fs::end(it); it.increment(ec)) {
        const std::string path = it->path().string();
        if (it->path().extension() == ".json" && path.find("-" + trigger + "/") != path.npos) {
          std::ifstream in(path);
          out.push_back(nlohmann::json::parse(in, nullptr, false));
        }
      }
      if (out.size() == kWorld) return out;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "no complete " << trigger << " dump under " << tmp_.Join("dumps");
    return {};
  }

  // Every dump file carries the diagnosis under commd.diagnosis.
  void ExpectDumpDiagnosis(const std::string& kind, const std::string& kind_enum,
                           const std::vector<int>& behind) {
    for (const nlohmann::json& dump : WaitForDump(kind)) {
      ASSERT_TRUE(dump.contains("commd")) << dump.dump();
      const nlohmann::json& d = dump["commd"]["diagnosis"];
      EXPECT_EQ(d["kind"], kind_enum) << d.dump();
      EXPECT_EQ(d["group"], "g");
      EXPECT_EQ(d["ranks_behind"].get<std::vector<int>>(), behind) << d.dump();
    }
  }

  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<std::unique_ptr<ChildProcess>> ranks_;
};

TEST_F(WatchdogTest, LaggingNamesTheSleepingRankAndNotifyAbortsTheOthers) {
  Start("");
  Ranks("notify", 1000, "lag", 5, 2);
  for (int r : {0, 1, 3}) WaitForLog(r, "WAITING 5");
  WaitForLog(2, "SLEEPING");
  const v1::GroupHealth h = WaitForDiagnosis();
  const v1::Diagnosis& d = h.last_diagnosis();
  EXPECT_EQ(d.kind(), v1::LAGGING) << d.DebugString();
  EXPECT_EQ(d.seq(), 5u);
  EXPECT_THAT(d.ranks_behind(), ElementsAre(2));
  EXPECT_THAT(d.ranks_ahead(), ElementsAre(0, 1, 3));
  ASSERT_EQ(d.ranks_size(), kWorld);
  EXPECT_EQ(d.ranks(0).op(), "all_reduce");
  EXPECT_THAT(d.ranks(0).input_sizes(), ElementsAre("[1024]"));
  EXPECT_EQ(d.ranks(2).op(), "");
  EXPECT_EQ(d.ranks(2).last_completed_seq(), 4u);
  for (int r : {0, 1, 3}) {
    WaitForLog(r,
               "ABORTED by the watchdog (some ranks never entered a collective the others are "
               "in): group g: rank(s) [2] never entered collective seq 5");
    WaitForLog(r, "CALLBACK ABORTED");
  }
  EXPECT_GE(Metric("commd_hangs_detected_total{kind=\"lagging\"}"), 1);
  EXPECT_GE(Metric("commd_aborts_total{reason=\"lagging\"}"), 1);
  ExpectDumpDiagnosis("hang-lagging", "LAGGING", {2});
  auto after = client_->GetHealth("g");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->groups(0).state(), v1::ABORTED);
  EXPECT_EQ(after->groups(0).abort_reason(), "lagging");
}

TEST_F(WatchdogTest, MismatchIsReportedAndAnAdminAbortStopsTheGroup) {
  Start("");  // default policy: report
  Ranks("default", 60000, "mismatch", 3, 1);
  for (int r = 0; r < kWorld; ++r) WaitForLog(r, "WAITING 3");
  const v1::Diagnosis d = WaitForDiagnosis().last_diagnosis();
  EXPECT_EQ(d.kind(), v1::MISMATCH) << d.DebugString();
  EXPECT_EQ(d.seq(), 3u);
  EXPECT_THAT(d.ranks_behind(), ElementsAre(1));
  EXPECT_EQ(d.ranks(1).op(), "all_gather");
  EXPECT_EQ(d.ranks(0).op(), "all_reduce");
  EXPECT_GE(Metric("commd_hangs_detected_total{kind=\"mismatch\"}"), 1);
  ExpectDumpDiagnosis("hang-mismatch", "MISMATCH", {1});
  // Report only: nobody was told to stop.
  for (auto& r : ranks_) EXPECT_THAT(r->Log(), ::testing::Not(HasSubstr("ABORTED")));

  // Another job neither sees nor aborts the group.
  auto other = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "other"});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->GetHealth("g").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*other)->Abort("g", "not mine").status().code(), absl::StatusCode::kNotFound);

  ProcessResult health = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(),
                                     "--job", "job", "health", "--group", "g"});
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("mismatch: group g: collective seq 3 differs"));
  ProcessResult json = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job",
                                   "job", "--json", "health", "--group", "g"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json parsed = nlohmann::json::parse(json.output, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << json.output;
  EXPECT_EQ(parsed["groups"][0]["last_diagnosis"]["kind"], "MISMATCH") << json.output;
  EXPECT_EQ(parsed["groups"][0]["last_diagnosis"]["ranks_behind"], nlohmann::json::parse("[1]"));
  ProcessResult bad = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job",
                                  "job", "abort", "--group", "g"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("--reason"));
  ProcessResult abort =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job", "job", "abort",
                  "--group", "g", "--reason", "operator says stop"});
  EXPECT_EQ(abort.exit_code, 0) << abort.output;
  EXPECT_THAT(abort.output, HasSubstr("4 rank(s) notified"));
  for (int r = 0; r < kWorld; ++r) {
    // Who asked, in words: the uid and program of the commctl call.
    WaitForLog(r, "ABORTED on request: uid 0 (commctl, pid ");
    WaitForLog(r, ") says: operator says stop");
    WaitForLog(r, "CALLBACK ABORTED");
  }
  EXPECT_GE(Metric("commd_aborts_total{reason=\"admin\"}"), 1);
  ProcessResult aborted = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(),
                                      "--job", "job", "health", "--group", "g"});
  EXPECT_EQ(aborted.exit_code, 0) << aborted.output;
  EXPECT_THAT(aborted.output, HasSubstr("[aborted on request]"));
  // The abort left a dump of every rank, saying why.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  int files = 0;
  while (files < kWorld && absl::Now() < deadline) {
    files = 0;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(tmp_.Join("dumps"), ec);
         !ec && it != fs::end(it); it.increment(ec)) {
      const std::string path = it->path().string();
      if (it->path().extension() != ".json" || path.find("-abort/") == path.npos) continue;
      std::ifstream in(path);
      const nlohmann::json dump = nlohmann::json::parse(in, nullptr, false);
      if (dump.is_discarded()) continue;
      const nlohmann::json& summary = dump["commd"]["diagnosis"]["summary"];
      // Who asked, then why: "uid 0 (commctl, pid 4242) says: operator says stop".
      if (summary.is_string() &&
          absl::StartsWith(summary.get<std::string>(), "uid 0 (commctl, pid ") &&
          absl::EndsWith(summary.get<std::string>(), ") says: operator says stop")) {
        ++files;
      }
    }
    if (files < kWorld) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(files, kWorld);
}

// An abort ends a symmetric allocation that waits for a rank which will never ask, instead of
// leaving the others to the group's ten-minute timeout.
TEST_F(WatchdogTest, AnAdminAbortEndsAPendingSymmetricAllocation) {
  Start("");
  Ranks("default", 600000, "alloc", 1, 1);
  WaitForLog(1, "SLEEPING");
  for (int r : {0, 2, 3}) WaitForLog(r, "ASKING");
  ProcessResult abort =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job", "job", "abort",
                  "--group", "g", "--reason", "rank 1 is gone for lunch"});
  EXPECT_EQ(abort.exit_code, 0) << abort.output;
  for (int r : {0, 2, 3}) {
    WaitForLog(r, "ALLOC ABORTED: group g aborted on request: uid 0 (commctl, pid ");
    WaitForLog(r, "says: rank 1 is gone for lunch; the group can make no new symmetric allocation");
  }
  WaitForLog(1, "ABORTED on request: uid 0 (commctl");
  for (auto& rank : ranks_) {
    const auto exit = rank->Wait(absl::Seconds(60));
    ASSERT_TRUE(exit.ok()) << exit.status() << rank->Log();
    EXPECT_EQ(exit->exit_code, 0) << rank->Log();
  }
}

TEST_F(WatchdogTest, StuckRankIsNamedAndTerminateEndsTheGroup) {
  Start("terminate_grace_ms: 300");
  Ranks("terminate", 1000, "stuck", 4, 3, 0, kWorld, /*ignores_sigterm=*/1);
  for (int r = 0; r < kWorld; ++r) WaitForLog(r, "WAITING 4");
  const v1::Diagnosis d = WaitForDiagnosis().last_diagnosis();
  EXPECT_EQ(d.kind(), v1::STUCK) << d.DebugString();
  EXPECT_EQ(d.seq(), 4u);
  EXPECT_THAT(d.ranks_behind(), ElementsAre(3));
  EXPECT_THAT(d.ranks_ahead(), ElementsAre(0, 1, 2));
  EXPECT_EQ(d.ranks(3).state(), "started");
  EXPECT_EQ(d.ranks(0).state(), "completed");
  for (auto& r : ranks_) {
    auto result = r->Wait(absl::Seconds(30));
    ASSERT_TRUE(result.ok()) << result.status() << r->Log();
    EXPECT_EQ(result->exit_code, -1) << r->Log();  // ended by a signal
    // Rank 1 ignores SIGTERM: the SIGKILL after terminate_grace_ms ends it.
    EXPECT_EQ(result->signal, &r == &ranks_[1] ? SIGKILL : SIGTERM) << r->Log();
  }
  EXPECT_GE(Metric("commd_hangs_detected_total{kind=\"stuck\"}"), 1);
  EXPECT_GE(Metric("commd_aborts_total{reason=\"stuck\"}"), 1);
  ExpectDumpDiagnosis("hang-stuck", "STUCK", {3});
}

TEST_F(WatchdogTest, KilledRankIsDeadAndTheOthersAreAborted) {
  Start("");
  Ranks("notify", 60000, "dead", 3, 1);
  WaitForLog(1, "VICTIM");
  for (int r : {0, 2, 3}) WaitForLog(r, "WAITING 3");
  const pid_t victim = ranks_[1]->pid();
  ASSERT_TRUE(ranks_[1]->Stop(SIGKILL).ok());
  const v1::Diagnosis d = WaitForDiagnosis().last_diagnosis();
  EXPECT_EQ(d.kind(), v1::DEAD) << d.DebugString();
  EXPECT_EQ(d.seq(), 3u);
  EXPECT_THAT(d.ranks_dead(), ElementsAre(1));
  EXPECT_EQ(d.ranks(1).liveness(), "dead");
  const std::string death = absl::StrCat("rank 1 (pid ", victim, ") exited: killed by SIGKILL");
  EXPECT_THAT(d.summary(), HasSubstr(death));
  for (int r : {0, 2, 3}) {
    WaitForLog(r, "ABORTED because a rank of the group died: group g: " + death);
    WaitForLog(r, "CALLBACK ABORTED");
  }
  EXPECT_EQ(Metric("commd_hangs_detected_total{kind=\"dead\"}"), 1);
  EXPECT_EQ(Metric("commd_aborts_total{reason=\"peer_dead\"}"), 1);
  // One dump for the death, with the diagnosis inside; not a second one as a hang.
  ExpectDumpDiagnosis("rank_death", "DEAD", {1});
  EXPECT_FALSE(fs::exists(tmp_.Join("dumps/job")) &&
               std::any_of(fs::directory_iterator(tmp_.Join("dumps/job")), fs::directory_iterator(),
                           [](const fs::directory_entry& e) {
                             return e.path().string().find("-hang-") != std::string::npos;
                           }));
}

TEST_F(WatchdogTest, RankThatLeftCleanlyWhileOthersWaitIsDead) {
  Start("");
  Ranks("notify", 60000, "leave", 2, 3);
  WaitForLog(3, "LEFT");
  for (int r : {0, 1, 2}) WaitForLog(r, "WAITING 2");
  const v1::Diagnosis d = WaitForDiagnosis().last_diagnosis();
  EXPECT_EQ(d.kind(), v1::DEAD) << d.DebugString();
  EXPECT_EQ(d.seq(), 2u);
  EXPECT_THAT(d.ranks_dead(), ElementsAre(3));
  EXPECT_EQ(d.ranks(3).liveness(), "left");
  for (int r : {0, 1, 2})
    WaitForLog(r, "ABORTED because a rank of the group died: group g: rank(s) [3] gone (left)");
}

TEST_F(WatchdogTest, SilentRankHoldingWorkIsUnresponsive) {
  Start("heartbeat_timeout_ms: 500");
  Ranks("notify", 60000, "silent", 2, 0);
  for (int r = 0; r < kWorld; ++r) WaitForLog(r, "WAITING 2");
  const v1::Diagnosis d = WaitForDiagnosis().last_diagnosis();
  EXPECT_EQ(d.kind(), v1::UNRESPONSIVE) << d.DebugString();
  EXPECT_EQ(d.seq(), 2u);
  EXPECT_THAT(d.ranks_behind(), ElementsAre(0));
  EXPECT_GE(d.ranks(0).heartbeat_age_ms(), 500);
  for (int r = 0; r < kWorld; ++r)
    WaitForLog(r,
               "ABORTED by the watchdog (a rank stopped its heartbeat with work unfinished): "
               "group g: rank(s) [0] stopped");
  EXPECT_GE(Metric("commd_hangs_detected_total{kind=\"unresponsive\"}"), 1);
  EXPECT_GE(Metric("commd_aborts_total{reason=\"unresponsive\"}"), 1);
  ExpectDumpDiagnosis("hang-unresponsive", "UNRESPONSIVE", {0});
}

TEST_F(WatchdogTest, RendezvousThatNeverCompletesIsDiagnosed) {
  Start("");
  Ranks("notify", 500, "fast", 1, 0, 0, /*world=*/3);  // rank 3 never comes
  for (int r = 0; r < 3; ++r) WaitForLog(r, "DEADLINE_EXCEEDED");
  const v1::Diagnosis d = WaitForDiagnosis().last_diagnosis();
  EXPECT_EQ(d.kind(), v1::RENDEZVOUS) << d.DebugString();
  EXPECT_THAT(d.ranks_behind(), ElementsAre(3));
  EXPECT_GE(Metric("commd_hangs_detected_total{kind=\"rendezvous\"}"), 1);
}

TEST_F(WatchdogTest, NoFalseAlarmForFastCollectivesAndALongComputeGap) {
  Start("");
  // 2 x 5000 collectives with jitter, and between them 2.5 s of compute with nothing pending:
  // longer than the 1.5 s timeout (which leaves room for a loaded CI machine's scheduling).
  Ranks("notify", 1500, "fast", 5000, 0, 2500);
  for (auto& r : ranks_) {
    auto result = r->Wait(absl::Seconds(120));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 0) << r->Log();
    EXPECT_THAT(result->output, HasSubstr("DONE"));
    EXPECT_THAT(result->output, ::testing::Not(HasSubstr("ABORTED")));
  }
  for (const char* kind : {"stuck", "lagging", "mismatch", "dead", "unresponsive"}) {
    EXPECT_EQ(Metric(absl::StrCat("commd_hangs_detected_total{kind=\"", kind, "\"}")), 0) << kind;
  }
  auto h = client_->GetHealth("g");
  if (h.ok() && h->groups_size() > 0) {
    EXPECT_FALSE(h->groups(0).has_last_diagnosis()) << h->DebugString();
  }
  // The daemon counted every collective from the control blocks, and kept the counts of the
  // group after its ranks left.
  EXPECT_EQ(Metric(R"(commd_collectives_total{group="g",job="job",op="all_reduce"})"),
            kWorld * 10000);
  EXPECT_GT(
      Metric(R"(commd_collective_duration_seconds_count{group="g",job="job",op="all_reduce"})"), 0);
  EXPECT_EQ(Metric(R"(commd_collective_bytes_total{group="g",job="job"})"),
            kWorld * 10000 * 1024 * 4.0);
}

}  // namespace
}  // namespace commd::testing
