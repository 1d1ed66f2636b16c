// The SDK's collectives end to end: the real daemon, N real rank processes (collective_rank)
// and every output checked against a float64 reference from fresh random inputs.
#include <sys/resource.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
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

  // Runs `world` ranks in `mode`; every rank must print "OK <mode>" and exit 0.
  void Run(int world, const std::string& mode) {
    const uint64_t seed = std::random_device{}();
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int r = 0; r < world; ++r) {
      auto c = ChildProcess::Start(
          {COLLECTIVE_RANK, std::to_string(r), std::to_string(world), std::to_string(seed), mode},
          {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=job"});
      ASSERT_TRUE(c.ok()) << c.status();
      ranks.push_back(std::move(*c));
    }
    for (int r = 0; r < world; ++r) {
      auto result = ranks[r]->Wait(absl::Minutes(3));
      ASSERT_TRUE(result.ok()) << "rank " << r << ": " << result.status() << "\n"
                               << ranks[r]->Log();
      EXPECT_EQ(result->exit_code, 0) << "rank " << r << " seed " << seed << ":\n"
                                      << ranks[r]->Log();
      EXPECT_NE(ranks[r]->Log().find("OK " + mode), std::string::npos) << ranks[r]->Log();
    }
  }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// Every collective x type x op at 1, 7, 4099 (not divisible by 2, 3, 4, 8) and 1024 elements.
TEST_P(CollectiveTest, MatrixMatchesReference) { Run(GetParam(), "matrix"); }
INSTANTIATE_TEST_SUITE_P(Worlds, CollectiveTest, ::testing::Values(2, 3, 4, 8));

// 1 MiB all-reduce (fp32, bf16), ~1 MiB reduce-scatter and all-gather: on 2 and 3 ranks only.
TEST_F(CollectiveTest, LargeSizes) {
  Run(2, "large");
  Run(3, "large");
}

TEST_F(CollectiveTest, TenThousandSmallIntAllReducesExact) {
  rusage before{}, after{};
  getrusage(RUSAGE_CHILDREN, &before);
  const absl::Time start = absl::Now();
  Run(2, "repeat");
  getrusage(RUSAGE_CHILDREN, &after);
  const double cpu = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) +
                     (after.ru_utime.tv_usec - before.ru_utime.tv_usec) / 1e6 +
                     (after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                     (after.ru_stime.tv_usec - before.ru_stime.tv_usec) / 1e6;
  std::printf("10,000 all-reduces, 2 ranks: wall %.2f s, rank CPU %.2f s\n",
              absl::ToDoubleSeconds(absl::Now() - start), cpu);
}

TEST_F(CollectiveTest, InvalidCallsGiveClearErrors) { Run(2, "invalid"); }

// NaN planted on rank 0: found with on, every 4th with sampled(4), ignored with off.
TEST_F(CollectiveTest, NanCheckModes) { Run(2, "nan"); }

}  // namespace
}  // namespace commd::testing
