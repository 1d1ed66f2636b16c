// Flight-recorder dumps against the real daemon: ranks are real processes recording into
// their control blocks; dumps are taken on request, on SIGUSR1, and when a rank is killed.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Every rank<N>.json under `dir`, by path.
std::vector<std::string> RankFiles(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->path().extension() == ".json") out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What must hold for any rank file: the schema, and entries in record order with sequence
// ids that only grow.
void ExpectConsistent(const nlohmann::json& dump, int world) {
  EXPECT_EQ(dump["version"], "2.10");
  ASSERT_TRUE(dump["entries"].is_array());
  std::string ranks = "[";
  for (int r = 0; r < world; ++r) absl::StrAppend(&ranks, r == 0 ? "" : ", ", r);
  ranks += "]";
  EXPECT_EQ(dump["pg_config"]["g"]["ranks"], ranks);
  int64_t last_record = -1, last_seq = -1;
  for (const auto& e : dump["entries"]) {
    EXPECT_GT(e["record_id"].get<int64_t>(), last_record);
    EXPECT_GT(e["collective_seq_id"].get<int64_t>(), last_seq);
    last_record = e["record_id"];
    last_seq = e["collective_seq_id"];
    EXPECT_EQ(e["profiling_name"], "nccl:all_reduce");
    EXPECT_EQ(e["input_sizes"], nlohmann::json::parse("[[1024, 1024]]"));
    EXPECT_EQ(e["input_dtypes"], nlohmann::json::parse(R"(["BFloat16"])"));
    EXPECT_THAT(e["state"].get<std::string>(),
                ::testing::AnyOf("scheduled", "started", "completed"));
  }
}

// Checks a rank file of the allreduce:N ranks (4 ranks, group "g", 16 int32 per call):
// entries in record order, one per collective, each whole (every field of the same
// collective: no torn entry) and with state and times that agree; only the newest may be
// unfinished, since a rank runs one collective at a time. Returns the newest entry's
// collective_seq_id, 0 when there is none.
int64_t ExpectCoherentAllReduces(const nlohmann::json& dump) {
  EXPECT_EQ(dump["version"], "2.10");
  const nlohmann::json& entries = dump["entries"];
  EXPECT_TRUE(entries.is_array());
  int64_t last_record = -1, last_seq = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& e = entries[i];
    SCOPED_TRACE(e.dump());
    const int64_t record = e["record_id"], seq = e["collective_seq_id"];
    EXPECT_GT(record, last_record);
    EXPECT_GT(seq, last_seq);
    EXPECT_EQ(seq, record + 1);  // nothing but these all-reduces is recorded
    last_record = record;
    last_seq = seq;
    EXPECT_EQ(e["profiling_name"], "nccl:all_reduce");
    EXPECT_EQ(e["process_group"][0], "g");
    EXPECT_EQ(e["input_sizes"], nlohmann::json::parse("[[16]]"));
    EXPECT_EQ(e["output_sizes"], nlohmann::json::parse("[[16]]"));
    EXPECT_EQ(e["input_dtypes"], nlohmann::json::parse(R"(["Int"])"));
    EXPECT_EQ(e["commd"]["bytes"], 64);
    EXPECT_EQ(e["is_p2p"], false);
    const std::string state = e["state"];
    const uint64_t created = e["time_created_ns"];
    const uint64_t started = e["commd"]["time_started_ns"];
    const uint64_t completed = e["commd"]["time_completed_ns"];
    if (i + 1 < entries.size()) {
      EXPECT_EQ(state, "completed");
    }
    if (state == "completed") {
      EXPECT_GE(started, created);
      EXPECT_GE(completed, started);
      EXPECT_TRUE(e["duration_ms"].is_number());
      EXPECT_EQ(e["retired"], true);
    } else if (state == "started") {
      EXPECT_GE(started, created);
      EXPECT_EQ(completed, 0u);
      EXPECT_EQ(e["retired"], false);
    } else {
      EXPECT_EQ(state, "scheduled");
      EXPECT_EQ(started, 0u);
      EXPECT_EQ(completed, 0u);
    }
  }
  return last_seq;
}

class RecorderTest : public ::testing::Test {
 protected:
  void Start(const std::string& config) {
    auto d = StartDaemonWithConfig(tmp_, config, {"--dump-dir", tmp_.Join("dumps")});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::vector<std::unique_ptr<ChildProcess>> Ranks(int world, const std::string& mode,
                                                   const std::string& ready,
                                                   const std::string& description = "") {
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int r = 0; r < world; ++r) {
      auto c = ChildProcess::Start(
          {COMMD_RANK_PROCESS, "g", std::to_string(r), std::to_string(world), "0", mode},
          {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=job",
           "COMMD_TEST_GROUP_DESCRIPTION=" + description});
      EXPECT_TRUE(c.ok());
      ranks.push_back(std::move(*c));
    }
    for (auto& r : ranks) EXPECT_TRUE(r->WaitForLog(ready, absl::Seconds(60))) << r->Log();
    return ranks;
  }
  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(RecorderTest, DumpsTakenWhileRanksRecordAreConsistent) {
  Start("recorder { ring_capacity: 1024 }");
  auto ranks = Ranks(4, "record-forever", "RECORDING");
  auto client = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(client.ok());
  // A rank that records nonstop can lap its 1024-slot ring while one read copies it (2 cores,
  // loaded machine); the reader reads newest first, so that costs a dump the rank's oldest
  // entries, never all of them: every dump shows entries of every rank.
  for (int i = 0; i < 5; ++i) {
    auto dump = (*client)->Dump("g");
    ASSERT_TRUE(dump.ok()) << dump.status();
    ASSERT_EQ(dump->files_size(), 4);
    for (const std::string& file : dump->files()) {
      const nlohmann::json j = ReadJson(file);
      ExpectConsistent(j, 4);
      EXPECT_FALSE(j["entries"].empty()) << file;
      EXPECT_LE(j["entries"].size(), 1024u);
      EXPECT_EQ(j["commd"]["trigger"], "request");
    }
  }
  EXPECT_EQ(Metric(R"(commd_flight_recorder_dumps_total{trigger="request"})"), 5);
  // Recorded entries and ring drops come from the control blocks at scrape time.
  EXPECT_GT(Metric(R"(commd_flight_recorder_entries_total{group="g",job="job"})"), 4 * 1024);
  EXPECT_GT(Metric(R"(commd_flight_recorder_dropped_total{group="g",job="job"})"), 0);
}

// Real collectives, not Recorder calls: 4 ranks each run 10,000 all-reduces through the SDK
// while the test dumps the group again and again.
TEST_F(RecorderTest, DumpsDuringRealAllReducesAreCoherentAndTheLastHoldsTheNewest) {
  constexpr int kRanks = 4, kCalls = 10000;
  constexpr uint32_t kCapacity = 4096;
  Start(absl::StrCat("recorder { ring_capacity: ", kCapacity, " }"));
  auto ranks = Ranks(kRanks, absl::StrCat("allreduce:", kCalls), "RUNNING");
  auto client = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto all_done = [&] {
    for (auto& r : ranks) {
      if (r->Log().find(absl::StrCat("ALLREDUCED ", kCalls)) == std::string::npos) return false;
    }
    return true;
  };
  int dumps_during_run = 0;  // rank files whose newest entry was not the last call
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (!all_done() && absl::Now() < deadline) {
    for (auto& r : ranks) ASSERT_EQ(r->Log().find("ERROR"), std::string::npos) << r->Log();
    auto dump = (*client)->Dump("g");
    ASSERT_TRUE(dump.ok()) << dump.status();
    ASSERT_EQ(dump->files_size(), kRanks);
    for (const std::string& file : dump->files()) {
      const int64_t newest = ExpectCoherentAllReduces(ReadJson(file));
      EXPECT_LE(newest, kCalls);
      if (newest < kCalls) ++dumps_during_run;
    }
    // Leaves the 4 spinning ranks the CPU most of the time (2 cores here): back-to-back
    // dumps slowed the run from ~1 s to ~14 s.
    absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_TRUE(all_done()) << ranks[0]->Log();
  std::printf("%d rank files dumped while the all-reduces ran\n", dumps_during_run);
  auto dump = (*client)->Dump("g");
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->files_size(), kRanks);
  for (const std::string& file : dump->files()) {
    SCOPED_TRACE(file);
    const nlohmann::json j = ReadJson(file);
    EXPECT_EQ(ExpectCoherentAllReduces(j), kCalls);  // the ring's newest is the last call
    ASSERT_EQ(j["entries"].size(), kCapacity);
    EXPECT_EQ(j["entries"].front()["collective_seq_id"], kCalls - kCapacity + 1);
    EXPECT_EQ(j["entries"].back()["state"], "completed");
    EXPECT_EQ(j["commd"]["counters"]["collectives"], kCalls);
    EXPECT_EQ(j["commd"]["counters"]["per_op"]["all_reduce"], kCalls);
    EXPECT_EQ(j["commd"]["dropped"], kCalls - kCapacity);
    ASSERT_EQ(j["pg_status"].size(), 1u);
    EXPECT_EQ(j["pg_status"].begin().value()["last_completed_collective"], kCalls);
  }
}

TEST_F(RecorderTest, DumpAfterARankIsKilledHoldsItsLastEntries) {
  Start("recorder { ring_capacity: 16384 }");
  auto ranks = Ranks(4, "record:10000", "RECORDED 10000");
  ASSERT_TRUE(ranks[2]->Stop(SIGKILL).ok());
  std::vector<std::string> files;
  for (int i = 0; i < 500 && files.size() < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    files.clear();
    for (const auto& f : RankFiles(tmp_.Join("dumps/job"))) {
      if (f.find("-rank_death/") != std::string::npos) files.push_back(f);
    }
  }
  ASSERT_EQ(files.size(), 4u);
  const nlohmann::json dead = ReadJson(files[2]);
  ASSERT_THAT(files[2], HasSubstr("/g/rank2.json"));
  ExpectConsistent(dead, 4);
  ASSERT_EQ(dead["entries"].size(), 10000u);
  EXPECT_EQ(dead["entries"].back()["record_id"], 9999);
  EXPECT_EQ(dead["entries"].back()["state"], "completed");
  EXPECT_EQ(dead["commd"]["trigger"], "rank_death");
  EXPECT_EQ(Metric(R"(commd_flight_recorder_dumps_total{trigger="rank_death"})"), 1);
}

TEST_F(RecorderTest, RingKeepsTheNewestEntriesAndCountsTheDropped) {
  Start("recorder { ring_capacity: 64 }");
  auto ranks = Ranks(2, "record:100", "RECORDED 100");
  auto client = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "job"});
  auto dump = (*client)->Dump();
  ASSERT_TRUE(dump.ok()) << dump.status();
  const nlohmann::json j = ReadJson(dump->files(0));
  ASSERT_EQ(j["entries"].size(), 64u);
  EXPECT_EQ(j["entries"].front()["record_id"], 36);
  EXPECT_EQ(j["entries"].back()["record_id"], 99);
  EXPECT_EQ(j["commd"]["dropped"], 36);
  // A group's series appear at the watchdog's first poll after it formed (poll_interval_ms);
  // from then on they are read from the control blocks at each scrape.
  const std::string entries = R"(commd_flight_recorder_entries_total{group="g",job="job"})";
  for (int i = 0; i < 200 && Metric(entries) == 0; ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Metric(entries), 200);
  EXPECT_EQ(Metric(R"(commd_flight_recorder_dropped_total{group="g",job="job"})"), 72);
}

TEST_F(RecorderTest, SigusrDumpsEveryGroupAndExportsForTorch) {
  Start("");
  auto ranks = Ranks(2, "record:100", "RECORDED 100");
  ::kill(daemon_->pid(), SIGUSR1);
  ASSERT_TRUE(daemon_->WaitForLog("dump (signal): 2 file(s)", absl::Seconds(10)));
  std::vector<std::string> files = RankFiles(tmp_.Join("dumps/job"));
  ASSERT_EQ(files.size(), 2u);
  EXPECT_THAT(files[0], HasSubstr("-signal/g/rank0.json"));
  EXPECT_EQ(Metric(R"(commd_flight_recorder_dumps_total{trigger="signal"})"), 1);

  // commctl fr export turns them into the pickles torchfrtrace reads; Python's own pickle
  // module must decode each into the same document.
  const std::string dump_dir = fs::path(files[0]).parent_path().parent_path().string();
  ProcessResult exported = RunProcess({COMMCTL_BINARY, "fr", "export", "--in", dump_dir, "--out",
                                       tmp_.Join("torch"), "--format", "torch"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("wrote 2 torchfrtrace file(s)"));
  for (int r = 0; r < 2; ++r) {
    const std::string pickle = tmp_.Join(absl::StrCat("torch/g/nccl_trace_rank_", r));
    ProcessResult py =
        RunProcess({"/usr/bin/python3", "-c",
                    "import json,pickle,sys\n"
                    "p=pickle.load(open(sys.argv[1],'rb')); j=json.load(open(sys.argv[2]))\n"
                    "assert p == j, 'pickle and JSON differ'\n"
                    "assert len(p['entries']) == 100 and p['version'] == '2.10'\n"
                    "print('same', len(p['entries']))\n",
                    pickle, files[r]});
    EXPECT_EQ(py.exit_code, 0) << py.output;
    EXPECT_THAT(py.output, HasSubstr("same 100"));
  }
  ProcessResult bad = RunProcess(
      {COMMCTL_BINARY, "fr", "export", "--in", tmp_.Join("nothing"), "--out", tmp_.Join("x")});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("nothing"));
}

TEST_F(RecorderTest, CommctlDumpAndErrors) {
  Start("");
  ProcessResult none =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job", "job", "dump"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.output, HasSubstr("no formed group"));
  auto ranks = Ranks(2, "record:10", "RECORDED 10");
  ProcessResult ok = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job",
                                 "job", "--group", "g", "--json", "dump"});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const nlohmann::json j = nlohmann::json::parse(ok.output);
  EXPECT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["entries"], "20");  // uint64 is a JSON string
}

// The description every rank gave its group is the process group's desc of the dump (in
// pg_config and in every entry's process_group), of the torchfrtrace pickle beside it, and
// of `commctl groups`.
TEST_F(RecorderTest, TheGroupsDescriptionIsItsDescInDumpsPicklesAndCommctlGroups) {
  Start("recorder { write_torch_pickle: true }");
  auto ranks = Ranks(2, "record:3", "RECORDED 3", "tensor parallel");
  auto client = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto dump = (*client)->Dump("g");
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->files_size(), 4);  // rank<N>.json and nccl_trace_rank_<N> per rank
  for (const std::string& file : dump->files()) {
    if (fs::path(file).extension() != ".json") continue;
    const nlohmann::json j = ReadJson(file);
    EXPECT_EQ(j["pg_config"]["g"]["desc"], "tensor parallel") << file;
    ASSERT_EQ(j["entries"].size(), 3u) << file;
    for (const auto& e : j["entries"]) {
      EXPECT_EQ(e["process_group"], nlohmann::json::parse(R"(["g", "tensor parallel"])"));
    }
    const std::string pickle =
        (fs::path(file).parent_path() /
         absl::StrCat("nccl_trace_rank_", j["commd"]["global_rank"].get<int>()))
            .string();
    ProcessResult py =
        RunProcess({"/usr/bin/python3", "-c",
                    "import pickle,sys\n"
                    "p=pickle.load(open(sys.argv[1],'rb'))\n"
                    "print(p['pg_config']['g']['desc'], '|', {tuple(e['process_group']) for e in "
                    "p['entries']})\n",
                    pickle});
    EXPECT_EQ(py.exit_code, 0) << py.output;
    EXPECT_EQ(py.output, "tensor parallel | {('g', 'tensor parallel')}\n");
  }
  ProcessResult groups = RunProcess(
      {COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job", "job", "groups"});
  ASSERT_EQ(groups.exit_code, 0) << groups.output;
  EXPECT_THAT(groups.output, HasSubstr("DESC"));
  EXPECT_THAT(groups.output, ::testing::ContainsRegex("job +g +tensor parallel +active"));
}

}  // namespace
}  // namespace commd::testing
