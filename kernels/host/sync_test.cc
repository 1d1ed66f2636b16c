// Synchronisation of the CPU collectives with real processes: back-to-back collectives,
// more ranks than cores, abort, missing peers, invalid calls, the fused NaN/Inf count.
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "gtest/gtest.h"
#include "kernels/float16.h"
#include "kernels/host/barrier.h"
#include "kernels/host/collectives.h"
#include "kernels/host/test_support.h"

namespace commd::kernels {
namespace {

using testing::CheckCopied;
using testing::CheckReduced;
using testing::FillInputs;
using testing::MappedView;
using testing::RankOutcome;
using testing::RunRanks;
using testing::SharedPage;
using testing::SplitMix64;
using testing::SymmetricHostMemory;

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

// Small integer all-reduces with no barrier in between: any reuse race shows as a wrong sum.
class BackToBackTest : public ::testing::TestWithParam<int> {};

TEST_P(BackToBackTest, TenThousandSmallIntegerAllReducesStayExact) {
  const int world = GetParam();
  constexpr int kIterations = 10000;
  const uint64_t base = SplitMix64(testing::RunSeed() ^ 0xb2b);
  auto mem = SymmetricHostMemory::Create(world, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(world, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(2)));
    int64_t in[64], out[64];
    for (int it = 0; it < kIterations; ++it) {
      const uint64_t seed = SplitMix64(base + it);
      const size_t count = 1 + it % 13;
      const DataType t = it % 2 ? DataType::kInt64 : DataType::kInt32;
      const Algorithm algo = (it / 2) % 2 ? Algorithm::kTwoShot : Algorithm::kOneShot;
      const bool in_place = (it / 4) % 2 == 1;
      std::byte* src = in_place ? mv->own_data() : reinterpret_cast<std::byte*>(in);
      std::byte* dst = in_place ? mv->own_data() : reinterpret_cast<std::byte*>(out);
      FillInputs(t, seed, rank, 0, count, src);
      const absl::Status s =
          AllReduce(mv->view(), src, dst, count, t, ReduceOp::kSum, algo, NanCheck::kOff, nullptr);
      if (!s.ok()) return absl::InternalError(absl::StrCat("iteration ", it, ": ", s.ToString()));
      RETURN_IF_ERROR(CheckReduced(t, ReduceOp::kSum, seed, world, dst, 0, count,
                                   absl::StrCat("iteration ", it)));
    }
    return std::string();
  });
  testing::ExpectAllOk(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Worlds, BackToBackTest, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat("W", info.param); });

// Ranks that outnumber the CPUs take one-shot up to what one exchange carries; ranks that
// fit keep the read bound alone.
TEST(OversubscribedTest, OneShotBoundIsWhatAnExchangeCarries) {
  const int cpus = OnlineCpus();
  EXPECT_EQ(OversubscribedOneShotMaxBytes(cpus), 0u);
  EXPECT_EQ(OversubscribedOneShotMaxBytes(1), 0u);
  EXPECT_EQ(OversubscribedOneShotMaxBytes(cpus + 1),
            ExchangeSlotBytes(cpus + 1) - kExchangePayloadOffset);
  EXPECT_GE(OversubscribedOneShotMaxBytes(cpus + 1), size_t{32});
}

// 8 ranks on this machine's (2) cores: waits must sleep, not spin, for this to finish.
TEST(OversubscribedTest, EightRanksCompleteMixedCollectives) {
  constexpr int kWorld = 8;
  constexpr int kRounds = 300;
  constexpr size_t kCount = 1024;
  const uint64_t base = SplitMix64(testing::RunSeed() ^ 0x8e8);
  auto mem = SymmetricHostMemory::Create(kWorld, kWorld * kCount * sizeof(float));
  ASSERT_TRUE(mem.ok()) << mem.status();
  const absl::Time start = absl::Now();
  const auto outcomes = RunRanks(kWorld, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(2)));
    std::vector<std::byte> in(kWorld * kCount * 4), out(kWorld * kCount * 4);
    for (int it = 0; it < kRounds; ++it) {
      const uint64_t seed = SplitMix64(base + it);
      const std::string what = absl::StrCat("round ", it);
      switch (it % 4) {
        case 0:
        case 1: {
          const Algorithm a = it % 4 ? Algorithm::kTwoShot : Algorithm::kOneShot;
          FillInputs(DataType::kFloat32, seed, rank, 0, kCount, in.data());
          RETURN_IF_ERROR(AllReduce(mv->view(), in.data(), out.data(), kCount, DataType::kFloat32,
                                    ReduceOp::kSum, a, NanCheck::kOn, nullptr));
          RETURN_IF_ERROR(CheckReduced(DataType::kFloat32, ReduceOp::kSum, seed, kWorld, out.data(),
                                       0, kCount, what));
          break;
        }
        case 2:
          FillInputs(DataType::kInt32, seed, rank, 0, kCount, in.data());
          RETURN_IF_ERROR(AllGather(mv->view(), in.data(), out.data(), kCount, DataType::kInt32,
                                    NanCheck::kOff, nullptr));
          for (int p = 0; p < kWorld; ++p) {
            RETURN_IF_ERROR(CheckCopied(DataType::kInt32, seed, p, out.data() + p * kCount * 4, 0,
                                        kCount, what));
          }
          break;
        case 3:
          FillInputs(DataType::kInt64, seed, rank, 0, kWorld * (kCount / 2), in.data());
          RETURN_IF_ERROR(ReduceScatter(mv->view(), in.data(), out.data(), kCount / 2,
                                        DataType::kInt64, ReduceOp::kMax, NanCheck::kOff, nullptr));
          RETURN_IF_ERROR(CheckReduced(DataType::kInt64, ReduceOp::kMax, seed, kWorld, out.data(),
                                       rank * (kCount / 2), kCount / 2, what));
          break;
      }
    }
    return std::string();
  });
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  double cpu = 0;
  for (const RankOutcome& o : outcomes) cpu += o.cpu_seconds;
  std::printf("8 ranks, %d collectives each: wall %.3f s, CPU (all ranks) %.3f s\n", kRounds, wall,
              cpu);
  testing::ExpectAllOk(outcomes);
}

// Ranks 0..2 wait in a collective (all_reduce, broadcast from rank 3, all_to_all) for rank 3,
// which instead sets the abort word.
class AbortTest : public ::testing::TestWithParam<std::string> {};

absl::Status WaitingCollective(const std::string& name, const HostCommView& v, int32_t* buf) {
  if (name == "broadcast") {
    return Broadcast(v, buf, 16, DataType::kInt32, 3, NanCheck::kOff, nullptr);
  }
  if (name == "all_to_all") {
    return AllToAll(v, buf, buf + 64, 16, DataType::kInt32, NanCheck::kOff, nullptr);
  }
  return AllReduce(v, buf, buf, 16, DataType::kInt32, ReduceOp::kSum, Algorithm::kTwoShot,
                   NanCheck::kOff, nullptr);
}

TEST_P(AbortTest, WaitersReturnAbortedPromptly) {
  const std::string name = GetParam();
  constexpr int kWorld = 4;
  auto mem = SymmetricHostMemory::Create(kWorld, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto page = SharedPage::Create();
  ASSERT_TRUE(page.ok()) << page.status();
  uint32_t* abort_word = page->at<uint32_t>(0);
  int64_t* abort_ns = page->at<int64_t>(64);
  const auto outcomes = RunRanks(kWorld, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv,
                     MappedView::Map(*mem, rank, abort_word, absl::Now() + absl::Seconds(60)));
    if (rank == 3) {
      absl::SleepFor(absl::Milliseconds(300));
      __atomic_store_n(abort_ns, MonotonicNs(), __ATOMIC_RELAXED);
      __atomic_store_n(abort_word, 5u, __ATOMIC_RELEASE);
      return std::string();
    }
    int32_t buf[128] = {};
    const absl::Status s = WaitingCollective(name, mv->view(), buf);
    const double late_ms = (MonotonicNs() - __atomic_load_n(abort_ns, __ATOMIC_RELAXED)) / 1e6;
    if (!absl::IsAborted(s)) return absl::InternalError("expected ABORTED, got " + s.ToString());
    if (!absl::StrContains(s.message(), name + " on rank") ||
        !absl::StrContains(s.message(), "rank 3")) {
      return absl::InternalError("message should name the collective and rank 3: " + s.ToString());
    }
    if (late_ms > 1000)
      return absl::InternalError(absl::StrCat("returned ", late_ms, " ms after abort"));
    // Later collectives fail at once.
    const absl::Status again = Barrier(mv->view());
    if (!absl::IsAborted(again))
      return absl::InternalError("barrier after abort: " + again.ToString());
    return absl::StrCat(late_ms);
  });
  testing::ExpectAllOk(outcomes);
  for (int r = 0; r < 3; ++r) {
    std::printf("%s: rank %d returned %s ms after the abort\n", name.c_str(), r,
                outcomes[r].report.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, AbortTest,
                         ::testing::Values("all_reduce", "broadcast", "all_to_all"),
                         [](const auto& info) { return info.param; });

// HostCommView::posted: once per collective that stages, after this rank's message went out
// and before its first wait. Rank 1 calls only once rank 0's hook ran, so a hook run after
// rank 0's first wait (which needs rank 1's message) ends both ranks' waits unmet. An
// aborted call returns before sending: no hook.
class PostedTest : public ::testing::TestWithParam<std::string> {};

absl::Status StagingCollective(const std::string& name, const HostCommView& v, int32_t* buf) {
  if (name == "all_reduce_carried") {  // the inputs ride in the exchange
    return AllReduce(v, buf, buf, 4, DataType::kInt32, ReduceOp::kSum, Algorithm::kOneShot,
                     NanCheck::kOff, nullptr);
  }
  if (name == "all_reduce_one_shot" || name == "all_reduce_two_shot") {
    // More than an exchange slot carries: staged in the data regions.
    return AllReduce(v, buf, buf, 2048, DataType::kInt32, ReduceOp::kSum,
                     name == "all_reduce_one_shot" ? Algorithm::kOneShot : Algorithm::kTwoShot,
                     NanCheck::kOff, nullptr);
  }
  if (name == "reduce_scatter") {
    return ReduceScatter(v, buf, buf + 64, 16, DataType::kInt32, ReduceOp::kSum, NanCheck::kOff,
                         nullptr);
  }
  if (name == "all_gather") {
    return AllGather(v, buf, buf + 64, 16, DataType::kInt32, NanCheck::kOff, nullptr);
  }
  if (name == "broadcast")
    return Broadcast(v, buf, 16, DataType::kInt32, 1, NanCheck::kOff, nullptr);
  return AllToAll(v, buf, buf + 64, 16, DataType::kInt32, NanCheck::kOff, nullptr);
}

TEST_P(PostedTest, RunsOnceAfterSendingBeforeTheFirstWait) {
  const std::string name = GetParam();
  auto mem = SymmetricHostMemory::Create(2, 64 * 1024);
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto page = SharedPage::Create();
  ASSERT_TRUE(page.ok()) << page.status();
  uint32_t* rank0_posted = page->at<uint32_t>(0);
  uint32_t* abort_word = page->at<uint32_t>(64);
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, abort_word, absl::InfiniteFuture()));
    HostCommView& v = mv->view();
    v.wait_limit = absl::Seconds(10);
    struct Hook {
      int calls = 0;
      uint32_t* shared = nullptr;
    } hook{.shared = rank == 0 ? rank0_posted : nullptr};
    v.posted = [](void* c) {
      auto* h = static_cast<Hook*>(c);
      ++h->calls;
      if (h->shared != nullptr) __atomic_store_n(h->shared, 1u, __ATOMIC_RELEASE);
    };
    v.posted_context = &hook;
    if (rank == 1) {
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (__atomic_load_n(rank0_posted, __ATOMIC_ACQUIRE) == 0) {
        if (absl::Now() > until) return absl::InternalError("rank 0's hook never ran");
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    std::vector<int32_t> buf(4096, rank + 1);
    RETURN_IF_ERROR(StagingCollective(name, v, buf.data()));
    if (hook.calls != 1)
      return absl::InternalError(absl::StrCat("hook ran ", hook.calls, " times"));
    // Aborted: the call returns before sending, and the hook stays unrun.
    if (rank == 0) __atomic_store_n(abort_word, 1u, __ATOMIC_RELEASE);
    while (__atomic_load_n(abort_word, __ATOMIC_ACQUIRE) == 0)
      absl::SleepFor(absl::Milliseconds(1));
    const absl::Status aborted = StagingCollective(name, v, buf.data());
    if (!absl::IsAborted(aborted))
      return absl::InternalError("expected ABORTED, got " + aborted.ToString());
    if (hook.calls != 1) {
      return absl::InternalError(
          absl::StrCat("hook ran on an aborted call (", hook.calls, " in all)"));
    }
    return std::string();
  });
  testing::ExpectAllOk(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Collectives, PostedTest,
                         ::testing::Values("all_reduce_carried", "all_reduce_one_shot",
                                           "all_reduce_two_shot", "reduce_scatter", "all_gather",
                                           "broadcast", "all_to_all"),
                         [](const auto& info) { return info.param; });

// Rank 2 never arrives: the others give up at their deadline naming it.
TEST(DeadlineTest, MissingPeerIsNamed) {
  constexpr int kWorld = 4;
  auto mem = SymmetricHostMemory::Create(kWorld, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(kWorld, [&](int rank) -> absl::StatusOr<std::string> {
    if (rank == 2) return std::string();
    const absl::Time deadline = absl::Now() + absl::Milliseconds(400);
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, deadline));
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const absl::Status s = AllReduce(mv->view(), buf, buf, 8, DataType::kFloat32, ReduceOp::kSum,
                                     Algorithm::kOneShot, NanCheck::kOff, nullptr);
    const absl::Duration late = absl::Now() - deadline;
    if (!absl::IsDeadlineExceeded(s)) {
      return absl::InternalError("expected DEADLINE_EXCEEDED, got " + s.ToString());
    }
    if (!absl::StrContains(s.message(), "ranks not arrived: [2]") ||
        !absl::StrContains(s.message(), "all_reduce")) {
      return absl::InternalError("message should name all_reduce and rank 2: " + s.ToString());
    }
    if (late > absl::Seconds(1)) return absl::InternalError("returned too late after the deadline");
    return std::string(s.message());
  });
  testing::ExpectAllOk(outcomes);
  std::printf("rank 0: %s\n", outcomes[0].report.c_str());
}

// The SDK's way: no deadline, a limit per wait. Rank 1 never arrives; rank 0's wait ends
// about wait_limit after it began (the first spins read no clock), naming rank 1.
TEST(DeadlineTest, WaitLimitEndsAWaitWithoutADeadline) {
  auto mem = SymmetricHostMemory::Create(2, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    if (rank == 1) return std::string();
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::InfiniteFuture()));
    mv->view().wait_limit = absl::Milliseconds(300);
    const absl::Time start = absl::Now();
    float buf[4] = {1, 2, 3, 4};
    const absl::Status s = AllReduce(mv->view(), buf, buf, 4, DataType::kFloat32, ReduceOp::kSum,
                                     Algorithm::kOneShot, NanCheck::kOff, nullptr);
    const absl::Duration took = absl::Now() - start;
    if (!absl::IsDeadlineExceeded(s) || !absl::StrContains(s.message(), "ranks not arrived: [1]")) {
      return absl::InternalError("expected DEADLINE_EXCEEDED naming rank 1, got " + s.ToString());
    }
    if (took < absl::Milliseconds(300)) {
      return absl::InternalError(absl::StrCat("gave up after ", absl::FormatDuration(took),
                                              ", before the 300ms wait limit"));
    }
    if (took > absl::Seconds(30)) return absl::InternalError("the wait limit was ignored");
    return std::string();
  });
  testing::ExpectAllOk(outcomes);
}

// A rank waiting for a late peer keeps the heartbeat word fresh, so the daemon's watchdog
// does not take the waiter for a rank that stopped.
TEST(HeartbeatTest, SleepingWaitStoresTheHeartbeat) {
  auto mem = SymmetricHostMemory::Create(2, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    uint64_t beat = 0;
    mv->view().heartbeat_ns = &beat;
    const auto before = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    if (rank == 1) absl::SleepFor(absl::Milliseconds(300));  // rank 0 sleeps in the barrier
    float buf[4] = {1, 2, 3, 4};
    RETURN_IF_ERROR(AllReduce(mv->view(), buf, buf, 4, DataType::kFloat32, ReduceOp::kSum,
                              Algorithm::kOneShot, NanCheck::kOff, nullptr));
    if (rank == 0 && beat < before) {
      return absl::InternalError(absl::StrCat("rank 0 waited ~300 ms but its heartbeat is ", beat,
                                              ", older than the wait's start ", before));
    }
    return std::string();
  });
  testing::ExpectAllOk(outcomes);
}

// Rank r's input holds r + 1 non-finite values; the count is per rank, fused into copy-in
// (or a scan when the input is in place), and off means 0.
TEST(NanCheckTest, CountsThisRanksNonFiniteInputs) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 100;
  auto mem = SymmetricHostMemory::Create(kWorld, kWorld * kCount * 4);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(kWorld, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
      for (const bool in_place : {false, true}) {
        for (const NanCheck check : {NanCheck::kOn, NanCheck::kOff}) {
          std::vector<std::byte> in(kWorld * kCount * 4), out(kWorld * kCount * 4);
          std::byte* src = in_place ? mv->own_data() : in.data();
          FillInputs(t, 7, rank, 0, kWorld * kCount, src);
          for (int k = 0; k <= rank; ++k) {
            const size_t i = 10 * k + 3;
            if (t == DataType::kFloat32) std::memcpy(src + 4 * i, &specials[k], 4);
            const Half h = FloatToHalf(specials[k]);
            const BFloat16 b = FloatToBFloat16(specials[k]);
            if (t == DataType::kFloat16) std::memcpy(src + 2 * i, &h.bits, 2);
            if (t == DataType::kBFloat16) std::memcpy(src + 2 * i, &b.bits, 2);
          }
          const uint64_t want = check == NanCheck::kOn ? rank + 1 : 0;
          CollectiveResult r;
          RETURN_IF_ERROR(AllReduce(mv->view(), src, in_place ? src : out.data(), kCount, t,
                                    ReduceOp::kSum, Algorithm::kTwoShot, check, &r));
          if (r.nonfinite_count != want) {
            return absl::InternalError(absl::StrCat("all_reduce ", DataTypeName(t), " in_place ",
                                                    in_place, ": count ", r.nonfinite_count,
                                                    ", want ", want));
          }
          if (!in_place) {
            RETURN_IF_ERROR(
                ReduceScatter(mv->view(), src, out.data(), kCount, t, ReduceOp::kMax, check, &r));
            if (r.nonfinite_count != want) return absl::InternalError("reduce_scatter count");
            RETURN_IF_ERROR(AllGather(mv->view(), src, out.data(), kCount, t, check, &r));
            if (r.nonfinite_count != want) return absl::InternalError("all_gather count");
          }
        }
      }
    }
    // Integers never count.
    int32_t ints[kCount];
    FillInputs(DataType::kInt32, 9, rank, 0, kCount, reinterpret_cast<std::byte*>(ints));
    CollectiveResult r;
    RETURN_IF_ERROR(AllReduce(mv->view(), ints, ints, kCount, DataType::kInt32, ReduceOp::kSum,
                              Algorithm::kOneShot, NanCheck::kOn, &r));
    if (r.nonfinite_count != 0) return absl::InternalError("int32 counted non-finite values");
    return std::string();
  });
  testing::ExpectAllOk(outcomes);
}

// A world of one: a copy with the NaN check, no waiting.
TEST(SingleRankTest, CollectivesCopy) {
  auto mem = SymmetricHostMemory::Create(1, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto mv = MappedView::Map(*mem, 0, nullptr, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(mv.ok()) << mv.status();
  int64_t in[10], out[10];
  FillInputs(DataType::kInt64, 3, 0, 0, 10, reinterpret_cast<std::byte*>(in));
  for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
    std::memset(out, 0, sizeof out);
    ASSERT_TRUE(AllReduce((*mv)->view(), in, out, 10, DataType::kInt64, ReduceOp::kAvg, a,
                          NanCheck::kOff, nullptr)
                    .ok());
    EXPECT_EQ(std::memcmp(in, out, sizeof in), 0);
  }
  EXPECT_TRUE(Barrier((*mv)->view()).ok());
}

}  // namespace
}  // namespace commd::kernels
