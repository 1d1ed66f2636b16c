// The SDK's collectives end to end: the real daemon, N real rank processes (collective_rank)
// and every output checked against a float64 reference from fresh random inputs.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "common/control_block.h"
#include "common/cuda_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

class CollectiveTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto d = StartDaemonWithConfig(tmp_, "");
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }

  // Restarts the daemon with `config`.
  void Restart(const std::string& config) {
    daemon_.reset();
    tmp_config_ = std::make_unique<TempDir>();
    auto d = StartDaemonWithConfig(*tmp_config_, config);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }

  // Starts `world` ranks in `mode`; with `hold`, each waits once done (printing "HOLDING")
  // until Finish releases it.
  std::vector<std::unique_ptr<ChildProcess>> Start(int world, const std::string& mode,
                                                   bool hold = false) {
    const uint64_t seed = std::random_device{}();
    seed_ = seed;
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    std::vector<std::string> env = {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(),
                                    "COMMD_JOB_ID=job"};
    if (hold) env.push_back("COLLECTIVE_RANK_HOLD=" + tmp_.Join("release"));
    for (int r = 0; r < world; ++r) {
      auto c = ChildProcess::Start(
          {COLLECTIVE_RANK, std::to_string(r), std::to_string(world), std::to_string(seed), mode},
          env);
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) ranks.push_back(std::move(*c));
    }
    return ranks;
  }

  void WaitForLog(const std::vector<std::unique_ptr<ChildProcess>>& ranks, int r,
                  const std::string& text) {
    EXPECT_TRUE(ranks[r]->WaitForLog(text, absl::Seconds(60))) << "rank " << r << ":\n"
                                                               << ranks[r]->Log();
  }

  // Each rank's dump entries of group c, by rank, once every rank of `ranks` (started with
  // `hold`) holds.
  std::vector<std::vector<nlohmann::json>> HeldEntries(
      const std::vector<std::unique_ptr<ChildProcess>>& ranks) {
    std::vector<std::vector<nlohmann::json>> by_rank(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) WaitForLog(ranks, static_cast<int>(r), "HOLDING");
    auto client = Connect();
    EXPECT_NE(client, nullptr);
    if (client == nullptr) return by_rank;
    auto dump = client->Dump("c");
    EXPECT_TRUE(dump.ok()) << dump.status();
    if (!dump.ok()) return by_rank;
    for (const std::string& file : dump->files()) {
      std::ifstream in(file);
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << file;
      if (j.is_discarded()) continue;
      const int rank = j["commd"]["rank"].get<int>();
      for (const nlohmann::json& e : j["entries"]) by_rank.at(rank).push_back(e);
    }
    return by_rank;
  }

  // Releases held ranks; every rank must print "OK <mode>" and exit 0.
  void Finish(std::vector<std::unique_ptr<ChildProcess>>& ranks, const std::string& mode) {
    std::ofstream(tmp_.Join("release")) << "go";
    const uint64_t seed = seed_;
    const int world = static_cast<int>(ranks.size());
    for (int r = 0; r < world; ++r) {
      auto result = ranks[r]->Wait(absl::Minutes(3));
      ASSERT_TRUE(result.ok()) << "rank " << r << ": " << result.status() << "\n"
                               << ranks[r]->Log();
      EXPECT_EQ(result->exit_code, 0) << "rank " << r << " seed " << seed << ":\n"
                                      << ranks[r]->Log();
      EXPECT_NE(ranks[r]->Log().find("OK " + mode), std::string::npos) << ranks[r]->Log();
    }
  }

  // Two held ranks in `mode`; once rank 0 holds and rank 1 says it is ENTERING a wait,
  // `commctl abort` of group c with `reason`.
  std::vector<std::unique_ptr<ChildProcess>> StartAndAbortWhileRankOneWaits(
      const std::string& mode, const std::string& reason) {
    auto ranks = Start(2, mode, /*hold=*/true);
    WaitForLog(ranks, 0, "HOLDING");
    WaitForLog(ranks, 1, "ENTERING");
    ProcessResult abort = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(),
                                      "--job", "job", "abort", "--group", "c", "--reason", reason});
    EXPECT_EQ(abort.exit_code, 0) << abort.output;
    return ranks;
  }

  // Runs `world` ranks in `mode`; every rank must print "OK <mode>" and exit 0.
  void Run(int world, const std::string& mode) {
    auto ranks = Start(world, mode);
    Finish(ranks, mode);
  }

  // Polls the metric until it reaches `want` (the watchdog adds the control blocks' counters
  // on each poll), then checks it is exactly that.
  void ExpectMetric(const std::string& key, double want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (MetricValue(*daemon_, key) < want && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(MetricValue(*daemon_, key), want) << key;
  }

  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "job"});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Run(), then prints the ranks' CPU time next to the wall time: waits must sleep, so CPU
  // stays well under wall x ranks (printed, never asserted: the machine is shared).
  void RunReportingCpu(int world, const std::string& mode, const std::string& what) {
    rusage before{}, after{};
    getrusage(RUSAGE_CHILDREN, &before);
    const absl::Time start = absl::Now();
    Run(world, mode);
    getrusage(RUSAGE_CHILDREN, &after);
    const double cpu = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) +
                       (after.ru_utime.tv_usec - before.ru_utime.tv_usec) / 1e6 +
                       (after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                       (after.ru_stime.tv_usec - before.ru_stime.tv_usec) / 1e6;
    std::printf("%s: wall %.2f s, rank CPU %.2f s\n", what.c_str(),
                absl::ToDoubleSeconds(absl::Now() - start), cpu);
  }

  TempDir tmp_;
  std::unique_ptr<TempDir> tmp_config_;
  uint64_t seed_ = 0;
  std::unique_ptr<DaemonProcess> daemon_;
};

// Every collective x type x op at 1, 7, 4099 (not divisible by 2, 3, 4, 8) and 1024 elements.
TEST_P(CollectiveTest, MatrixMatchesReference) { Run(GetParam(), "matrix"); }
INSTANTIATE_TEST_SUITE_P(Worlds, CollectiveTest, ::testing::Values(2, 3, 4, 8));

// The fused matmuls (async tensor parallelism) against the unfused float64 reference: every
// type, odd shapes, several Bs, 3-D A with row scales, the gathered A on request, sum and avg.
class FusedMatmulTest : public CollectiveTest {};
TEST_P(FusedMatmulTest, MatchesTheUnfusedReference) { Run(GetParam(), "matmul"); }
INSTANTIATE_TEST_SUITE_P(Worlds, FusedMatmulTest, ::testing::Values(1, 2, 3, 4));
// Bad calls get INVALID_ARGUMENT naming the value and the range; the group stays usable.
TEST_F(FusedMatmulTest, InvalidCallsGiveClearErrors) { Run(3, "matmul_invalid"); }
TEST_F(FusedMatmulTest, NanInAShardUnderPolicyFailGivesDataLossOnEveryRank) {
  Run(2, "matmul_nan_fail");
}
TEST_F(FusedMatmulTest, ARankThatNeverArrivesIsNamedAtTheDeadline) {
  Run(3, "matmul_missing_rank");
}

// The overloads on ordinary host memory (a symmetric buffer as the staging area): the same
// matrix against the reference, reading and writing the user's memory (all-reduce out of
// place and in place).
class HostMemoryTest : public CollectiveTest {};
TEST_P(HostMemoryTest, MatrixMatchesReference) { Run(GetParam(), "host_matrix"); }
// All-gather from this rank's block of its output, reduce-scatter into this rank's chunk of its
// input, all-to-all in place.
TEST_P(HostMemoryTest, OverlappingInputAndOutputMatchReference) {
  Run(GetParam(), "host_overlapping");
}
INSTANTIATE_TEST_SUITE_P(Worlds, HostMemoryTest, ::testing::Values(2, 3, 4));

TEST_F(HostMemoryTest, LargeSizes) { Run(2, "host_large"); }

// Too large for the staging buffer, null and misaligned pointers, memory overlapping the
// staging buffer, a staging buffer of another group: INVALID_ARGUMENT naming the value.
TEST_F(HostMemoryTest, InvalidCallsGiveClearErrors) { Run(2, "host_invalid"); }

TEST_F(HostMemoryTest, NanPolicyFailGivesDataLossOnEveryRank) { Run(2, "host_nan_fail"); }

// 1 MiB all-reduce (fp32, bf16), ~1 MiB reduce-scatter and all-gather: on 2 and 3 ranks only.
TEST_F(CollectiveTest, LargeSizes) {
  Run(2, "large");
  Run(3, "large");
}

TEST_F(CollectiveTest, TenThousandSmallIntAllReducesExact) {
  RunReportingCpu(2, "repeat", "10,000 all-reduces, 2 ranks");
}

TEST_F(CollectiveTest, InvalidCallsGiveClearErrors) { Run(2, "invalid"); }

// NaN planted on rank 0: found with on, every 4th with sampled(4), ignored with off.
TEST_F(CollectiveTest, NanCheckModes) { Run(2, "nan"); }

// The group's default check from the config (collectives.nan_check ON): NaN/Inf planted on
// rank 1 in 5 of 8 all-reduces. Every rank learns of it, the metrics count every rank's
// checks and the hits, and the dump flags exactly rank 1's 5 entries.
TEST_F(CollectiveTest, NanGroupDefaultOnCountsChecksAndFlagsTheDump) {
  Restart("collectives { nan_check: NAN_CHECK_ON }\n");
  auto ranks = Start(2, "nan_group", /*hold=*/true);
  for (int r = 0; r < 2; ++r) WaitForLog(ranks, r, "HOLDING");
  ExpectMetric("commd_nan_checks_total", 16);
  ExpectMetric("commd_nan_detected_total", 5);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto dump = client->Dump("c");
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->files_size(), 2);
  for (const std::string& file : dump->files()) {
    std::ifstream in(file);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << file;
    const nlohmann::json& c = j["commd"];
    const int rank = c["rank"].get<int>();
    EXPECT_EQ(c["counters"]["nan_checks"], 8) << file;
    EXPECT_EQ(c["counters"]["nans_found"], rank == 1 ? 5 : 0) << file;
    std::vector<uint64_t> flagged;
    for (const nlohmann::json& e : j["entries"]) {
      if (e["commd"]["nan_found"].get<bool>()) flagged.push_back(e["collective_seq_id"]);
    }
    if (rank == 1) {
      EXPECT_THAT(flagged, ::testing::ElementsAre(1, 2, 3, 4, 5)) << file;
    } else {
      EXPECT_TRUE(flagged.empty()) << file;
    }
  }
  Finish(ranks, "nan_group");
}

// GroupOptions: sampled every 3rd collective checks 10 of 30 on each rank; the metrics agree.
TEST_F(CollectiveTest, NanGroupSampledChecksEveryThirdCollective) {
  auto ranks = Start(2, "nan_sampled3", /*hold=*/true);
  for (int r = 0; r < 2; ++r) WaitForLog(ranks, r, "HOLDING");
  ExpectMetric("commd_nan_checks_total", 20);
  ExpectMetric("commd_nan_detected_total", 10);
  Finish(ranks, "nan_sampled3");
}

// Policy FAIL: DATA_LOSS on every rank naming rank 1, the buffer stays usable; for an
// all-reduce, a broadcast (NaN in the root's buffer; none from a clean root) and an all-to-all.
TEST_F(CollectiveTest, NanPolicyFailGivesDataLossOnEveryRank) { Run(2, "nan_fail"); }

// Three all-reduces given part_of an entry recorded by hand: that one entry, of the whole
// collective's shape, completed; ids a part may not name get INVALID_ARGUMENT naming them
// and record nothing; the next all-reduce records its own entry at the next seq.
TEST_F(CollectiveTest, PartsOfACollectiveWriteItsOneEntry) {
  auto ranks = Start(2, "part_of", /*hold=*/true);
  const auto entries = HeldEntries(ranks);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(entries[r].size(), 2u);
    const nlohmann::json& whole = entries[r][0];
    EXPECT_EQ(whole["collective_seq_id"], 1);
    EXPECT_EQ(whole["profiling_name"], "nccl:all_reduce");  // torch's analyzer's spelling
    EXPECT_EQ(whole["input_sizes"], nlohmann::json::parse("[[3000]]"));
    EXPECT_EQ(whole["output_sizes"], nlohmann::json::parse("[[3000]]"));
    EXPECT_EQ(whole["state"], "completed");
    const nlohmann::json& own = entries[r][1];
    EXPECT_EQ(own["collective_seq_id"], 2);
    EXPECT_EQ(own["input_sizes"], nlohmann::json::parse("[[1000]]"));
    EXPECT_EQ(own["state"], "completed");
  }
  Finish(ranks, "part_of");
}

// Policy FAIL and NaN in rank 1's second part: DATA_LOSS on every rank naming the whole
// collective's seq 1, whose entry is flagged on rank 1 and retired (abandoned by the caller,
// not left pending); the group's next collective completes at seq 2.
TEST_F(CollectiveTest, NanInAPartUnderPolicyFailFailsTheWholeCollective) {
  auto ranks = Start(2, "part_of_nan_fail", /*hold=*/true);
  const auto entries = HeldEntries(ranks);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(entries[r].size(), 2u);
    const nlohmann::json& whole = entries[r][0];
    EXPECT_EQ(whole["collective_seq_id"], 1);
    EXPECT_EQ(whole["input_sizes"], nlohmann::json::parse("[[3000]]"));
    EXPECT_EQ(whole["retired"], true);
    EXPECT_NE(whole["state"], "completed");
    EXPECT_EQ(whole["commd"]["nan_found"], r == 1);
    EXPECT_EQ(entries[r][1]["collective_seq_id"], 2);
    EXPECT_EQ(entries[r][1]["state"], "completed");
  }
  Finish(ranks, "part_of_nan_fail");
}

// Check off (even under policy FAIL): NaN goes through, nothing is counted.
TEST_F(CollectiveTest, NanCheckOffIgnoresNan) {
  auto ranks = Start(2, "nan_off_fail", /*hold=*/true);
  for (int r = 0; r < 2; ++r) WaitForLog(ranks, r, "HOLDING");
  absl::SleepFor(absl::Milliseconds(300));  // a few watchdog polls
  EXPECT_EQ(MetricValue(*daemon_, "commd_nan_checks_total"), 0);
  EXPECT_EQ(MetricValue(*daemon_, "commd_nan_detected_total"), 0);
  Finish(ranks, "nan_off_fail");
}

// Ranks call all-reduce with 100 and 200 elements: INVALID_ARGUMENT on both, and the
// watchdog reports a mismatch at that seq (the entries stay incomplete).
TEST_F(CollectiveTest, MismatchedCountsFailEveryRankAndTheWatchdogSaysMismatch) {
  auto ranks = Start(2, "mismatch", /*hold=*/true);
  for (int r = 0; r < 2; ++r) WaitForLog(ranks, r, "MISMATCHED");
  for (int r = 0; r < 2; ++r) WaitForLog(ranks, r, "HOLDING");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  nlohmann::json parsed;
  while (absl::Now() < deadline) {
    ProcessResult json = RunProcess({COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(),
                                     "--job", "job", "--json", "health", "--group", "c"});
    parsed = nlohmann::json::parse(json.output, nullptr, false);
    if (json.exit_code == 0 && !parsed.is_discarded() && parsed.contains("groups") &&
        !parsed["groups"].empty() && parsed["groups"][0].contains("last_diagnosis")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(parsed.is_discarded());
  const nlohmann::json& d = parsed["groups"][0]["last_diagnosis"];
  EXPECT_EQ(d["kind"], "MISMATCH") << parsed.dump();
  EXPECT_TRUE(d["seq"] == "2" || d["seq"] == 2) << parsed.dump();
  Finish(ranks, "mismatch");
}

// Rank 1 waits in an all-reduce that rank 0 never enters; commctl abort ends the wait with
// ABORTED and the reason.
TEST_F(CollectiveTest, AbortEndsACollectiveWaitWithTheReason) {
  auto ranks = StartAndAbortWhileRankOneWaits("abort", "stop the collective test");
  WaitForLog(ranks, 1, "ABORTED: group c aborted on request: uid 0 (commctl, pid ");
  WaitForLog(ranks, 1, ") says: stop the collective test (all_reduce on rank 1");
  WaitForLog(ranks, 1, ": the daemon aborted the group)");
  Finish(ranks, "abort");
}

// Group::Run skips the argument checks of a call equal to the last one that passed on the
// same buffer (collective_call.h CheckedKey). Whatever passed before, every call that differs
// is still checked: a count that does not fit, a type or op or root out of range, bad
// options, the buffer in another group, host pointers inside the staging buffer or
// misaligned; and each entry in the flight recorder has the call's own shape.
TEST_F(CollectiveTest, ACallOnABufferIsCheckedWhateverPassedOnItBefore) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto group = client->JoinGroup({.name = "g", .rank = 0, .world_size = 1});
  ASSERT_TRUE(group.ok()) << group.status();
  auto other = client->JoinGroup({.name = "other", .rank = 0, .world_size = 1});
  ASSERT_TRUE(other.ok()) << other.status();
  auto buf = (*group)->AllocateSymmetric(64);  // 16 floats
  ASSERT_TRUE(buf.ok()) << buf.status();
  SymmetricBuffer& b = **buf;
  const auto f32 = DataType::kFloat32;
  const auto sum = ReduceOp::kSum;
  const auto invalid = absl::StatusCode::kInvalidArgument;
  Group& g = **group;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(g.AllReduce(b, 4, f32, sum).ok());
  auto st = g.AllReduce(b, 17, f32, sum);
  EXPECT_EQ(st.code(), invalid);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("17 elements of 4 bytes"));
  EXPECT_EQ(g.AllReduce(b, 9, DataType::kInt64, sum).code(), invalid);
  EXPECT_EQ(g.AllReduce(b, 4, static_cast<DataType>(99), sum).code(), invalid);
  EXPECT_EQ(g.AllReduce(b, 4, DataType::kFloat8E4M3, sum).code(), invalid);
  EXPECT_EQ(g.AllReduce(b, 4, DataType::kBool, ReduceOp::kAvg).code(), invalid);
  EXPECT_EQ(g.AllReduce(b, 4, f32, static_cast<ReduceOp>(9)).code(), invalid);
  // The shape that passed, with bad options: still refused.
  EXPECT_EQ(g.AllReduce(b, 4, f32, sum, {.nan_check = static_cast<CollectiveOptions::NanCheck>(7)})
                .code(),
            invalid);
  EXPECT_EQ(g.AllReduce(b, 4, f32, sum, {.timeout = absl::Seconds(-1)}).code(), invalid);
  st = g.AllReduce(b, 4, f32, sum,
                   {.nan_check = CollectiveOptions::NanCheck::kSampled, .nan_sample_period = 0});
  EXPECT_EQ(st.code(), invalid);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("nan_sample_period 0 is out of range"));
  ASSERT_TRUE(g.AllReduce(b, 4, f32, sum).ok());
  // Another group: the buffer is not its own, whatever passed in the buffer's group.
  st = (*other)->AllReduce(b, 4, f32, sum);
  EXPECT_EQ(st.code(), invalid);
  EXPECT_THAT(st.message(), ::testing::HasSubstr("was not allocated by this group"));
  ASSERT_TRUE(g.Broadcast(b, 4, f32, 0).ok());
  EXPECT_EQ(g.Broadcast(b, 4, f32, 1).code(), invalid);
  ASSERT_TRUE(g.Broadcast(b, 4, f32, 0).ok());
  EXPECT_EQ(g.Broadcast(b, 4, f32, 1).code(), invalid);

  // Host memory through the same staging buffer: the pointers are part of the call.
  alignas(8) float host[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(g.AllReduce(host, host, 4, f32, sum, b).ok());
  EXPECT_EQ(g.AllReduce(b.data(), host, 4, f32, sum, b).code(), invalid);  // inside staging
  EXPECT_EQ(g.AllReduce(host, b.data(), 4, f32, sum, b).code(), invalid);
  auto* misaligned = reinterpret_cast<float*>(reinterpret_cast<char*>(host) + 1);
  EXPECT_EQ(g.AllReduce(misaligned, host, 4, f32, sum, b).code(), invalid);
  EXPECT_EQ(g.AllReduce(host, host, 17, f32, sum, b).code(), invalid);
  ASSERT_TRUE(g.AllReduce(host, host, 4, f32, sum, b).ok());
  EXPECT_EQ(host[0], 1.0f);  // a world of one: the sum is the input
  // The kernels' call prepared with the checks (PreparedCall::kernel) follows the call: after
  // calls into one output, a call into another writes that one.
  float out_a[4] = {}, out_b[4] = {};
  ASSERT_TRUE(g.AllReduce(host, out_a, 4, f32, sum, b).ok());
  ASSERT_TRUE(g.AllReduce(host, out_a, 4, f32, sum, b).ok());
  ASSERT_TRUE(g.AllReduce(host + 4, out_b, 4, f32, sum, b).ok());
  EXPECT_EQ(out_a[3], 4.0f);
  EXPECT_EQ(out_b[3], 8.0f);

  // The last entries of the ring: each call's own count, in the order called.
  ASSERT_TRUE(g.AllReduce(b, 2, f32, sum).ok());
  ASSERT_TRUE(g.AllReduce(b, 2, f32, sum).ok());
  ASSERT_TRUE(g.AllReduce(b, 3, DataType::kInt64, sum).ok());
  ASSERT_TRUE(g.Barrier().ok());
  auto* base = static_cast<char*>(g.control_block());
  const auto* state = reinterpret_cast<const ControlBlockRingState*>(base + kRingStateOffset);
  const auto* header = reinterpret_cast<const ControlBlockHeader*>(base);
  const auto* ring = reinterpret_cast<const RingEntry*>(base + kRingOffset);
  const uint64_t next = state->next_record_id;
  ASSERT_GE(next, 4u);
  struct Want {
    uint8_t ndims;
    int64_t dim;
    DataType dtype;
    uint64_t bytes;
    CollectiveOp op;
  };
  const Want want[] = {{1, 2, DataType::kFloat32, 8, CollectiveOp::kAllReduce},
                       {1, 2, DataType::kFloat32, 8, CollectiveOp::kAllReduce},
                       {1, 3, DataType::kInt64, 24, CollectiveOp::kAllReduce},
                       {0, 0, DataType::kFloat32, 0, CollectiveOp::kBarrier}};
  for (uint64_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    const RingEntry& e = ring[(next - 4 + i) & (header->ring_capacity - 1)];
    EXPECT_EQ(e.record_id, next - 4 + i);
    EXPECT_EQ(e.op, static_cast<uint16_t>(want[i].op));
    EXPECT_EQ(e.num_inputs, want[i].ndims);
    EXPECT_EQ(e.input_ndims[0], want[i].ndims);
    EXPECT_EQ(e.bytes, want[i].bytes);
    EXPECT_STREQ(e.pg_name, "g");
    EXPECT_EQ(e.state, static_cast<uint8_t>(RecordState::kCompleted));
    if (want[i].ndims > 0) {
      EXPECT_EQ(e.input_dims[0][0], want[i].dim);
      EXPECT_EQ(e.output_dims[0][0], want[i].dim);
      EXPECT_EQ(e.input_dtypes[0], static_cast<uint8_t>(want[i].dtype));
    }
  }
}

// The flight-recorder entry of a call whose checks were skipped (an equal call passed on its
// buffer before) is recorded from the shape prepared with those checks (collective_call.h
// PreparedCall): over three laps of the ring, first with the calls' shapes moving from slot
// to slot, then with each slot keeping one shape (where the ring skips the shape's fields),
// every entry holds its own call's op, tensors, bytes, group and timeout, completed and
// retired.
TEST_F(CollectiveTest, EveryEntryHoldsItsCallsShapeOverLaps) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto group = client->JoinGroup({.name = "g", .rank = 0, .world_size = 1});
  ASSERT_TRUE(group.ok()) << group.status();
  Group& g = **group;
  auto buf = g.AllocateSymmetric(64);
  ASSERT_TRUE(buf.ok()) << buf.status();
  SymmetricBuffer& b = **buf;
  auto buf2 = g.AllocateSymmetric(64);
  ASSERT_TRUE(buf2.ok()) << buf2.status();
  SymmetricBuffer& b2 = **buf2;
  alignas(8) float host_in[4] = {1, 2, 3, 4};
  alignas(8) float host_out[4] = {};
  const auto f32 = DataType::kFloat32;
  const auto sum = ReduceOp::kSum;
  struct Kind {
    std::function<absl::Status()> call;
    CollectiveOp op;
    uint8_t tensors;  // 0 or 1 a side
    int64_t in_dim, out_dim;
    DataType dtype;
    uint64_t bytes;
  };
  const std::vector<Kind> kinds = {
      {[&] { return g.AllReduce(b, 4, f32, sum); }, CollectiveOp::kAllReduce, 1, 4, 4,
       DataType::kFloat32, 16},
      {[&] { return g.Broadcast(b, 3, DataType::kInt32, 0); }, CollectiveOp::kBroadcast, 1, 3, 3,
       DataType::kInt32, 12},
      {[&] { return g.Barrier(); }, CollectiveOp::kBarrier, 0, 0, 0, DataType::kFloat32, 0},
      {[&] { return g.AllReduce(host_in, host_out, 2, f32, sum, b); }, CollectiveOp::kAllReduce, 1,
       2, 2, DataType::kFloat32, 8},
      {[&] { return g.AllGather(host_in, host_out, 2, DataType::kInt64, b); },
       CollectiveOp::kAllGather, 1, 2, 2, DataType::kInt64, 16},
      {[&] { return g.AllToAll(b, b2, 3, DataType::kInt64); }, CollectiveOp::kAllToAll, 1, 3, 3,
       DataType::kInt64, 24},
  };
  auto* base = static_cast<char*>(g.control_block());
  const auto* header = reinterpret_cast<const ControlBlockHeader*>(base);
  const auto* state = reinterpret_cast<const ControlBlockRingState*>(base + kRingStateOffset);
  const auto* ring = reinterpret_cast<const RingEntry*>(base + kRingOffset);
  const uint64_t capacity = header->ring_capacity;
  const uint64_t first = state->next_record_id;
  // Phase 1: the six kinds in turn (6 does not divide the ring's capacity, a power of two, so
  // each slot gets another shape every lap) for a lap and three calls; phase 2: the first four
  // in turn by record id (each slot keeps one shape) for two laps.
  ASSERT_NE(capacity % kinds.size(), 0u);
  const uint64_t phase1_end = first + capacity + 3;
  auto kind_of = [&](uint64_t r) -> size_t {
    return r < phase1_end ? (r - first) % kinds.size() : r % 4;
  };
  uint64_t next = first;
  auto run_until = [&](uint64_t end) {
    for (; next < end; ++next) {
      const absl::Status st = kinds[kind_of(next)].call();
      ASSERT_TRUE(st.ok()) << "record " << next << ": " << st;
    }
  };
  uint64_t timeout_ms = 0;
  auto check_last_lap = [&] {
    ASSERT_EQ(state->next_record_id, next);
    if (timeout_ms == 0) timeout_ms = ring[first % capacity].timeout_ms;
    for (uint64_t r = next - capacity; r < next; ++r) {
      SCOPED_TRACE(::testing::Message() << "record " << r << ", kind " << kind_of(r));
      const RingEntry& e = ring[r % capacity];
      const Kind& k = kinds[kind_of(r)];
      ASSERT_EQ(e.record_id, r);
      EXPECT_EQ(e.op, static_cast<uint16_t>(k.op));
      EXPECT_EQ(e.num_inputs, k.tensors);
      EXPECT_EQ(e.num_outputs, k.tensors);
      EXPECT_EQ(e.total_inputs, k.tensors);
      EXPECT_EQ(e.input_ndims[0], k.tensors);
      EXPECT_EQ(e.output_ndims[0], k.tensors);
      EXPECT_EQ(e.bytes, k.bytes);
      EXPECT_EQ(e.peer, -1);
      EXPECT_EQ(e.timeout_ms, timeout_ms);
      EXPECT_STREQ(e.pg_name, "g");
      EXPECT_EQ(e.state, static_cast<uint8_t>(RecordState::kCompleted));
      EXPECT_EQ(e.flags, kRecordFlagRetired);
      EXPECT_NE(e.time_started_ns, 0u);
      EXPECT_GE(e.time_completed_ns, e.time_started_ns);
      if (k.tensors > 0) {
        EXPECT_EQ(e.input_dims[0][0], k.in_dim);
        EXPECT_EQ(e.output_dims[0][0], k.out_dim);
        EXPECT_EQ(e.input_dtypes[0], static_cast<uint8_t>(k.dtype));
        EXPECT_EQ(e.output_dtypes[0], static_cast<uint8_t>(k.dtype));
      }
    }
  };
  run_until(phase1_end);
  check_last_lap();
  EXPECT_GT(timeout_ms, 0u);
  run_until(phase1_end + 2 * capacity);
  check_last_lap();
}

// Collectives on CUDA buffers need a group on a CUDA device, which the daemon refuses at join
// when it has no CUDA memory backend (no driver or no device): the SDK's CUDA path is never
// reached there, and the error says what to use instead.
TEST_F(CollectiveTest, CudaGroupWithoutADeviceIsRefusedAtJoin) {
  if (ProbeCudaDriver().available) GTEST_SKIP() << "a CUDA device is present";
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto group = client->JoinGroup({.name = "gpu",
                                  .rank = 0,
                                  .world_size = 1,
                                  .device = Device::Cuda(0),
                                  .timeout = absl::Seconds(20)});
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(),
              ::testing::HasSubstr("device cuda:0 is not available on this node; use 'host'"));
}

// The GPU test plan (docs/gpu-testing.md; scripts/gpu-tests runs every test named *Gpu*).
// Ranks per GPU: COMMD_GPU_RANKS_PER_GPU (scripts/gpu-tests --ranks-per-gpu), else 8 on a
// node with one GPU (every rank of every test shares it; issue #36) and 1 on more. The rank
// processes inherit the variable and take GPU rank / ranks-per-GPU (GpuOfRank).
int RanksPerGpu() {
  const CudaDriverInfo& cuda = ProbeCudaDriver();
  int per_gpu = cuda.device_count == 1 ? 8 : 1;
  if (const char* env = std::getenv("COMMD_GPU_RANKS_PER_GPU"); env != nullptr) {
    per_gpu = std::max(1, std::atoi(env));
  }
  ::setenv("COMMD_GPU_RANKS_PER_GPU", std::to_string(per_gpu).c_str(), 1);
  return per_gpu;
}

// Skips, saying why, when the node's GPUs cannot hold `ranks` ranks at RanksPerGpu() each.
#define COMMD_NEED_GPUS(ranks)                                                         \
  do {                                                                                 \
    const CudaDriverInfo& cuda = ProbeCudaDriver();                                    \
    const int per_gpu = RanksPerGpu();                                                 \
    const int gpus = ((ranks) + per_gpu - 1) / per_gpu;                                \
    if (!cuda.available || cuda.device_count < gpus) {                                 \
      GTEST_SKIP() << "needs a CUDA build and " << gpus << " GPU(s) for " << (ranks)   \
                   << " ranks at " << per_gpu << " per GPU (COMMD_GPU_RANKS_PER_GPU; " \
                   << cuda.summary << ")";                                             \
    }                                                                                  \
  } while (0)

// Two ranks (on GPUs 0 and 1, or sharing one) through the real daemon: stream-ordered all-reduce
// (one-shot and two-shot, fp32 and bf16), reduce-scatter, all-gather and barrier against the
// reference, and NaN counted on the device reaching the control block's counters.
TEST_F(CollectiveTest, CudaCollectivesOnTwoGpus) {
  COMMD_NEED_GPUS(2);
  Run(2, "cuda");
}

// 8 ranks (an HGX node), odd counts (7, 1025, 4099), fp32 and bf16, NaN counted on the device.
TEST_F(CollectiveTest, CudaCollectivesOnEightGpus) {
  COMMD_NEED_GPUS(8);
  Run(8, "cuda");
}

// Two allocations, in-place one-shot all-reduces on two streams at once (scratch per stream).
TEST_F(CollectiveTest, CudaTwoStreamsTwoAllocationsOnTwoGpus) {
  COMMD_NEED_GPUS(2);
  Run(2, "cuda_streams");
}

// Each rank sees only its own GPU, as cuda:0 (SLURM, Kubernetes): placed by UUID, peers mapped.
TEST_F(CollectiveTest, CudaRemappedDevicesOnTwoGpus) {
  COMMD_NEED_GPUS(2);
  Run(2, "cuda_remapped");
}

// The fused matmuls' CUDA path (cuBLAS on each peer's memory, stream-ordered readiness) against
// the unfused float64 reference: every type, scales, 3-D A, the gathered A, sum and avg.
TEST_F(CollectiveTest, CudaFusedMatmulsOnTwoGpus) {
  COMMD_NEED_GPUS(2);
  Run(2, "cuda_matmul");
}
TEST_F(CollectiveTest, CudaFusedMatmulsOnFourGpus) {
  COMMD_NEED_GPUS(4);
  Run(4, "cuda_matmul");
}

// A kernel spinning at a barrier ends when the group is aborted; the next call is ABORTED.
TEST_F(CollectiveTest, CudaAbortMidKernelOnTwoGpus) {
  COMMD_NEED_GPUS(2);
  auto ranks = StartAndAbortWhileRankOneWaits("cuda_abort", "stop the kernel");
  WaitForLog(ranks, 1, "rank 1: ABORTED");
  Finish(ranks, "cuda_abort");
}

// The figures of docs/gpu-testing.md on every GPU of the node (printed, never asserted):
// one-shot 8 KiB latency (one-shot allowed up to 8 KiB x 16 ranks) and 64 MiB busbw.
TEST_F(CollectiveTest, CudaAllReduceFiguresOnGpus) {
  COMMD_NEED_GPUS(2);
  Restart("collectives { one_shot_max_read_bytes: 131072 }\n");
  // One rank per GPU, at most 8, whatever the ranks per GPU of the other tests (NCCL's figures
  // in the same run are one rank per GPU); on one GPU, two ranks sharing it.
  const int gpus = ProbeCudaDriver().device_count;
  const std::string per_gpu = std::to_string(RanksPerGpu());
  ::setenv("COMMD_GPU_RANKS_PER_GPU", gpus == 1 ? "2" : "1", 1);
  auto ranks = Start(gpus == 1 ? 2 : std::min(gpus, 8), "cuda_bench");
  ::setenv("COMMD_GPU_RANKS_PER_GPU", per_gpu.c_str(), 1);  // the rank processes have theirs
  for (auto& r : ranks) {
    auto result = r->Wait(absl::Minutes(3));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 0) << result->output;
    for (absl::string_view line : absl::StrSplit(result->output, '\n')) {
      if (absl::StartsWith(line, "BENCH ")) std::printf("%s\n", std::string(line).c_str());
    }
  }
}

// More ranks than cores: 8 ranks on this machine's cores, 2,000 exact int all-reduces.
TEST_F(CollectiveTest, EightRanksRepeatAllReducesExact) {
  RunReportingCpu(
      8, "repeat:2000",
      absl::StrCat("2,000 all-reduces, 8 ranks on ", sysconf(_SC_NPROCESSORS_ONLN), " CPU(s)"));
}

}  // namespace
}  // namespace commd::testing
