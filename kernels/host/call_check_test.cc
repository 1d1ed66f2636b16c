// The per-call check of the CPU collectives with real processes: ranks that disagree on the
// call all fail with INVALID_ARGUMENT and the allocation stays usable; the NaN/Inf finding of
// one rank reaches every rank.
#include "kernels/host/call_check.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "gtest/gtest.h"
#include "kernels/host/collectives.h"
#include "kernels/host/plan.h"
#include "kernels/host/test_support.h"

namespace commd::kernels {
namespace {

using testing::CheckReduced;
using testing::FillInputs;
using testing::MappedView;
using testing::RunRanks;
using testing::SplitMix64;
using testing::SymmetricHostMemory;

// A correct all-reduce of `count` int32 (exact) on the allocation, checked.
absl::Status ExactAllReduce(MappedView& mv, uint64_t seed, size_t count, Algorithm algorithm) {
  std::vector<std::byte> in(count * 4), out(count * 4);
  FillInputs(DataType::kInt32, seed, mv.view().rank, 0, count, in.data());
  RETURN_IF_ERROR(AllReduce(mv.view(), in.data(), out.data(), count, DataType::kInt32,
                            ReduceOp::kSum, algorithm, NanCheck::kOff, nullptr));
  return CheckReduced(DataType::kInt32, ReduceOp::kSum, seed, mv.view().world_size, out.data(), 0,
                      count, "all_reduce after the mismatch");
}

// The message must name the ranks and their counts.
absl::Status ExpectMismatch(const absl::Status& s, const std::vector<std::string>& needles) {
  if (s.code() != absl::StatusCode::kInvalidArgument) {
    return absl::InternalError(absl::StrCat("want INVALID_ARGUMENT, got ", s.ToString()));
  }
  for (const std::string& n : needles) {
    if (!absl::StrContains(s.message(), n)) {
      return absl::InternalError(absl::StrCat("'", n, "' missing from: ", s.message()));
    }
  }
  return absl::OkStatus();
}

class MismatchTest : public ::testing::TestWithParam<int> {};

// Rank r calls with 100 + 100 * (r == last) elements, in both algorithms and for every kind;
// then a correct all-reduce on the same allocation must be exact.
TEST_P(MismatchTest, EveryRankFailsAndTheAllocationStaysUsable) {
  const int world = GetParam();
  const uint64_t seed = SplitMix64(testing::RunSeed() ^ 0x5151);
  auto mem = SymmetricHostMemory::Create(world, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(world, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    const HostCommView& v = mv->view();
    const size_t count = rank == world - 1 ? 200 : 100;
    const std::string odd = absl::StrCat("rank ", world - 1, " has 200 x float32");
    const std::string even = world == 2 ? "rank 0 has 100 x float32" : "ranks 0, 1 have 100";
    std::vector<float> in(count * world, 1.0f), out(count * world);
    for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
      RETURN_IF_ERROR(ExpectMismatch(AllReduce(v, in.data(), out.data(), count, DataType::kFloat32,
                                               ReduceOp::kSum, a, NanCheck::kOn, nullptr),
                                     {"all_reduce", "disagree", even, odd, AlgorithmWords(a)}));
      RETURN_IF_ERROR(ExactAllReduce(*mv, SplitMix64(seed + static_cast<int>(a)), 37, a));
    }
    RETURN_IF_ERROR(ExpectMismatch(
        AllGather(v, in.data(), out.data(), count, DataType::kFloat32, NanCheck::kOff, nullptr),
        {"all_gather", even, odd}));
    RETURN_IF_ERROR(
        ExpectMismatch(ReduceScatter(v, in.data(), out.data(), count, DataType::kFloat32,
                                     ReduceOp::kMax, NanCheck::kOff, nullptr),
                       {"reduce_scatter", even, odd, "(max)"}));
    RETURN_IF_ERROR(ExpectMismatch(
        AllToAll(v, in.data(), out.data(), count, DataType::kFloat32, NanCheck::kOff, nullptr),
        {"all_to_all", even, odd}));
    // Another root on the last rank, same count.
    const int root = rank == world - 1 ? 1 : 0;
    RETURN_IF_ERROR(ExpectMismatch(
        Broadcast(v, in.data(), 100, DataType::kFloat32, root, NanCheck::kOff, nullptr),
        {"broadcast", "disagree", absl::StrCat("rank ", world - 1, " has 100 x float32 (root 1)"),
         "100 x float32 (root 0)"}));
    RETURN_IF_ERROR(ExactAllReduce(*mv, SplitMix64(seed + 5), 11, Algorithm::kOneShot));
    // Another type on one rank, same count.
    const DataType t = rank == 0 ? DataType::kInt32 : DataType::kFloat32;
    RETURN_IF_ERROR(ExpectMismatch(AllReduce(v, in.data(), out.data(), 100, t, ReduceOp::kSum,
                                             Algorithm::kOneShot, NanCheck::kOff, nullptr),
                                   {"rank 0 has 100 x int32", "100 x float32"}));
    RETURN_IF_ERROR(ExactAllReduce(*mv, SplitMix64(seed + 7), 1000, Algorithm::kTwoShot));
    RETURN_IF_ERROR(ExactAllReduce(*mv, SplitMix64(seed + 8), 3, Algorithm::kOneShot));
    // A one-shot whose inputs travel in the exchange (100 floats) against one staged in the
    // data regions (3000 floats: more than a slot's payload).
    const size_t big = rank == world - 1 ? 3000 : 100;
    std::vector<float> bin(big, 1.0f), bout(big);
    RETURN_IF_ERROR(ExpectMismatch(
        AllReduce(v, bin.data(), bout.data(), big, DataType::kFloat32, ReduceOp::kSum,
                  Algorithm::kOneShot, NanCheck::kOff, nullptr),
        {absl::StrCat("rank ", world - 1, " has 3000 x float32"), "100 x float32 (sum, one-shot"}));
    RETURN_IF_ERROR(ExactAllReduce(*mv, SplitMix64(seed + 9), 5, Algorithm::kOneShot));
    return std::string("ok");
  });
  testing::ExpectAllOk(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Worlds, MismatchTest, ::testing::Values(2, 3));

// Coalesced calls that differ only in a later tensor are told apart too.
TEST(MismatchTest, CoalescedLaterTensorDiffers) {
  auto mem = SymmetricHostMemory::Create(2, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    std::vector<int32_t> a(16, 1), b(16, 2), oa(16), ob(16);
    const TensorArgs ts[] = {{a.data(), oa.data(), 16, DataType::kInt32},
                             {b.data(), ob.data(), rank == 1 ? 9u : 8u, DataType::kInt32}};
    RETURN_IF_ERROR(
        ExpectMismatch(AllReduceCoalesced(mv->view(), ts, ReduceOp::kSum, Algorithm::kOneShot,
                                          NanCheck::kOff, nullptr),
                       {"rank 0 has 2 tensors, the first 16 x int32", "rank 1 has", "call hash"}));
    RETURN_IF_ERROR(ExactAllReduce(*mv, 99, 5, Algorithm::kOneShot));
    return std::string("ok");
  });
  testing::ExpectAllOk(outcomes);
}

// In-place inputs at different offsets of the ranks' data regions fail on every rank before
// two-shot pushes a byte: rank 1's region beyond its own input keeps its contents.
TEST(MismatchTest, InPlaceOffsetsDiffer) {
  auto mem = SymmetricHostMemory::Create(2, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    auto* region = reinterpret_cast<int32_t*>(mv->own_data());
    for (int i = 0; i < 4096; ++i) region[i] = 7;
    int32_t* buf = region + (rank == 1 ? 1024 : 0);
    RETURN_IF_ERROR(
        ExpectMismatch(AllReduce(mv->view(), buf, buf, 1024, DataType::kInt32, ReduceOp::kSum,
                                 Algorithm::kTwoShot, NanCheck::kOff, nullptr),
                       {"call hash", "data-region offsets differ"}));
    for (int i = 0; i < 4096; ++i) {
      if (region[i] != 7) {
        return absl::InternalError(
            absl::StrCat("element ", i, " of rank ", rank, "'s region changed to ", region[i]));
      }
    }
    RETURN_IF_ERROR(ExactAllReduce(*mv, 98, 5, Algorithm::kTwoShot));
    return std::string("ok");
  });
  testing::ExpectAllOk(outcomes);
}

// A hostile member of the group scribbles random bytes over another rank's exchange area
// (flags, call words, payloads, the sleeping flag) while that rank runs collectives: every
// call ends with INVALID_ARGUMENT (a forged call word) or DEADLINE_EXCEEDED (a peer that
// never sends or never reaches the barrier) within its wait limit, and nothing is read or
// written outside the buffers (ASan build). What the victim cannot be spared is a wrong result
// from a peer that forges a matching message (its 31-bit call hash), as from one that gives
// wrong inputs.
TEST(HostileExchangeTest, ScribbledAreaEndsEachCallCleanly) {
  constexpr int kCalls = 60;
  auto mem = SymmetricHostMemory::Create(2, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto stop = testing::SharedPage::Create();
  ASSERT_TRUE(stop.ok()) << stop.status();
  uint32_t* done = stop->at<uint32_t>(0);
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::InfiniteFuture()));
    HostCommView v = mv->view();
    auto* area = reinterpret_cast<std::byte*>(v.pads[0]) + ExchangeAreaOffset(2);
    const size_t area_bytes = SignalPadBytes(2) - ExchangeAreaOffset(2);
    if (rank == 1) {  // the scribbler: never calls a collective
      uint64_t x = 0x5eed;
      const absl::Time give_up = absl::Now() + absl::Minutes(1);  // should rank 0 die
      while (__atomic_load_n(done, __ATOMIC_ACQUIRE) == 0 && absl::Now() < give_up) {
        for (size_t i = 0; i + 8 <= area_bytes; i += 8) {
          x = SplitMix64(x);
          __atomic_store_n(reinterpret_cast<uint64_t*>(area + i), x, __ATOMIC_RELAXED);
        }
      }
      return std::string("scribbled");
    }
    v.wait_limit = absl::Milliseconds(20);
    int ok = 0, invalid = 0, late = 0;
    std::vector<int32_t> in(512, 1), out(1024);
    for (int i = 0; i < kCalls; ++i) {
      absl::Status st;
      switch (i % 3) {
        case 0:  // carried in the exchange
          st = AllReduce(v, in.data(), out.data(), 2, DataType::kInt32, ReduceOp::kSum,
                         Algorithm::kOneShot, NanCheck::kOn, nullptr);
          break;
        case 1:
          st = AllReduce(v, in.data(), out.data(), 512, DataType::kInt32, ReduceOp::kMax,
                         Algorithm::kTwoShot, NanCheck::kOff, nullptr);
          break;
        default:
          st = AllGather(v, in.data(), out.data(), 512, DataType::kInt32, NanCheck::kOff, nullptr);
      }
      if (st.ok()) {
        ++ok;
      } else if (absl::IsInvalidArgument(st)) {
        ++invalid;
      } else if (absl::IsDeadlineExceeded(st)) {
        ++late;
      } else {
        __atomic_store_n(done, 1u, __ATOMIC_RELEASE);
        return absl::InternalError(absl::StrCat("call ", i, ": ", st.ToString()));
      }
    }
    __atomic_store_n(done, 1u, __ATOMIC_RELEASE);
    // A forged message passes only if its 31-bit call hash equals this rank's: never, here.
    if (ok != 0 || invalid + late != kCalls) {
      return absl::InternalError(absl::StrCat(ok, " ok, ", invalid, " invalid, ", late, " late"));
    }
    return absl::StrCat(ok, " ok, ", invalid, " invalid, ", late, " late");
  });
  for (const testing::RankOutcome& o : outcomes) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, o.report.c_str());
  }
  testing::ExpectAllOk(outcomes);
}

class NanFindingTest : public ::testing::TestWithParam<int> {};

// NaN and Inf planted on the last rank only: every rank's result names that rank, with the
// count, for both algorithms; ranks that do not check (kOff) report a clean group.
TEST_P(NanFindingTest, EveryRankNamesTheRankWithNan) {
  const int world = GetParam();
  auto mem = SymmetricHostMemory::Create(world, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(world, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    const int bad = world - 1;
    for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
      std::vector<float> in(64, 1.0f), out(64);
      if (rank == bad) {
        in[3] = std::numeric_limits<float>::quiet_NaN();
        in[9] = std::numeric_limits<float>::infinity();
        in[10] = std::numeric_limits<float>::quiet_NaN();
      }
      CollectiveResult r;
      RETURN_IF_ERROR(AllReduce(mv->view(), in.data(), out.data(), 64, DataType::kFloat32,
                                ReduceOp::kSum, a, NanCheck::kOn, &r));
      const uint64_t here = rank == bad ? 3 : 0;
      if (r.nonfinite_count != here || r.nonfinite_ranks != 1 || r.first_nonfinite_rank != bad ||
          r.group_nonfinite_count != 3) {
        return absl::InternalError(absl::StrCat(
            AlgorithmName(a), ": got count ", r.nonfinite_count, " ranks ", r.nonfinite_ranks,
            " first ", r.first_nonfinite_rank, " group ", r.group_nonfinite_count));
      }
      if (out[0] != static_cast<float>(world) || !std::isnan(out[3])) {
        return absl::InternalError(absl::StrCat("wrong sums ", out[0], " ", out[3]));
      }
      RETURN_IF_ERROR(AllReduce(mv->view(), in.data(), out.data(), 64, DataType::kFloat32,
                                ReduceOp::kSum, a, NanCheck::kOff, &r));
      if (r.nonfinite_ranks != 0 || r.first_nonfinite_rank != -1) {
        return absl::InternalError(
            absl::StrCat("unchecked call reported rank ", r.first_nonfinite_rank));
      }
    }
    return std::string("ok");
  });
  testing::ExpectAllOk(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Worlds, NanFindingTest, ::testing::Values(1, 2, 3));

// A broadcast checks the root's buffer only: NaN on the root is every rank's finding, NaN on
// another rank (overwritten by the root's data) is nobody's.
TEST(NanFindingTest, BroadcastReportsTheRootsBuffer) {
  constexpr int kWorld = 3;
  auto mem = SymmetricHostMemory::Create(kWorld, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(kWorld, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    for (const int root : {2, 0}) {
      std::vector<float> buf(32, static_cast<float>(rank + 1));
      buf[5] = std::numeric_limits<float>::quiet_NaN();  // every rank, only the root's counts
      buf[6] = rank == 2 ? std::numeric_limits<float>::infinity() : 1.0f;
      CollectiveResult r;
      RETURN_IF_ERROR(Broadcast(mv->view(), buf.data(), buf.size(), DataType::kFloat32, root,
                                NanCheck::kOn, &r));
      const uint64_t root_bad = root == 2 ? 2 : 1;
      const uint64_t here = rank == root ? root_bad : 0;
      if (r.nonfinite_count != here || r.nonfinite_ranks != 1 || r.first_nonfinite_rank != root ||
          r.group_nonfinite_count != root_bad || buf[0] != static_cast<float>(root + 1)) {
        return absl::InternalError(absl::StrCat("root ", root, ": got count ", r.nonfinite_count,
                                                " ranks ", r.nonfinite_ranks, " first ",
                                                r.first_nonfinite_rank, " group ",
                                                r.group_nonfinite_count, " value ", buf[0]));
      }
    }
    return std::string("ok");
  });
  testing::ExpectAllOk(outcomes);
}

// ---- Prepared calls (PrepareAllReduce / AllReducePrepared) ----

// The staging word of the call hash as the ranks computed it per call before calls were
// prepared, written out here independently of the kernels: 1 then each in-place input's
// offset in the own region, or 0 then the packed offsets (64-byte aligned) of outside inputs;
// each step digest * 31 + offset. Tensors with count 0 are not staged.
uint64_t ExpectedStaging(const HostCommView& view, const std::vector<TensorArgs>& tensors) {
  const std::byte* own = view.data[view.rank];
  bool in_place = false;
  for (const TensorArgs& t : tensors) {
    const auto* p = static_cast<const std::byte*>(t.input);
    if (t.count > 0) in_place = p >= own && p < own + view.data_bytes;
  }
  uint64_t digest = in_place ? 1 : 0;
  size_t packed = 0;
  for (const TensorArgs& t : tensors) {
    if (t.count == 0) continue;
    const size_t offset =
        in_place ? static_cast<size_t>(static_cast<const std::byte*>(t.input) - own) : packed;
    digest = digest * 31 + offset;
    packed = AlignUp(packed + t.count * DataTypeSize(t.dtype), 64);
  }
  return digest;
}

std::string Words(const CallWords& w) {
  return absl::StrCat("{call 0x", absl::Hex(w.call), " nan ", w.nan_count, " count ", w.count,
                      " shape 0x", absl::Hex(w.shape), "}");
}

bool SameWords(const CallWords& a, const CallWords& b) {
  return a.call == b.call && a.nan_count == b.nan_count && a.count == b.count && a.shape == b.shape;
}

// For every type, op and algorithm, one to three tensors of several counts (an empty one
// among them), in place at several offsets or outside the regions, on ranks 0 and 1 of a
// world of 2: the prepared call's words, with any NaN finding added, are exactly the words
// made from the whole call with its staging offsets, as every rank sent them per call before
// calls were prepared. So ranks on the prepared path and ranks on the full path agree.
TEST(PreparedCallTest, CallWordsAreTheUnpreparedOnes) {
  auto mem = SymmetricHostMemory::Create(2, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::vector<std::byte> outside_in(1 << 14), outside_out(1 << 14);
  int checked = 0;
  for (int rank : {0, 1}) {
    auto mv = MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1));
    ASSERT_TRUE(mv.ok()) << mv.status();
    const HostCommView& view = (*mv)->view();
    std::byte* own = (*mv)->own_data();
    for (const DataType dtype : kCollectiveTypes) {
      const size_t es = DataTypeSize(dtype);
      for (const std::vector<size_t>& counts : std::vector<std::vector<size_t>>{
               {1}, {7}, {1000}, {16, 0, 3}, {5, 9}, {0, 0, 0, 0, 1}, {0}}) {
        for (const size_t base : {size_t{0}, size_t{64}, size_t{4096}, SIZE_MAX}) {
          std::vector<TensorArgs> tensors;
          size_t at = base == SIZE_MAX ? 0 : base;
          for (size_t count : counts) {
            std::byte* p = base == SIZE_MAX ? outside_in.data() + at : own + at;
            std::byte* q = base == SIZE_MAX ? outside_out.data() + at : p;
            tensors.push_back({p, q, count, dtype});
            at += AlignUp(count * es, 128) + 128;
          }
          for (int op = 0; op < kReduceOpCount; ++op) {
            if (!ReduceOpApplies(static_cast<ReduceOp>(op), dtype)) continue;
            for (const Algorithm algorithm : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
              PreparedCollective prepared;
              ASSERT_TRUE(
                  PrepareAllReduce(view, tensors, static_cast<ReduceOp>(op), algorithm, &prepared)
                      .ok());
              const CallSignature call{.kind = CollectiveOp::kAllReduce,
                                       .op = static_cast<ReduceOp>(op),
                                       .algorithm = algorithm,
                                       .tensors = tensors,
                                       .staging = ExpectedStaging(view, tensors)};
              for (const uint64_t nonfinite : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 33}) {
                const CallWords want = MakeCallWords(call, nonfinite);
                const CallWords got = AddNonfinite(prepared.words, nonfinite);
                ASSERT_TRUE(SameWords(want, got))
                    << "rank " << rank << " type " << DataTypeName(dtype) << " tensors "
                    << counts.size() << " first count " << counts[0] << " base " << base << " op "
                    << op << " algorithm " << static_cast<int>(algorithm) << " nonfinite "
                    << nonfinite << ": prepared " << Words(got) << ", whole call " << Words(want);
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  // Every type x op but bool's avg and the floats' (fp32, fp16, bf16, fp64) bitwise ops.
  EXPECT_EQ(checked, 2 * (kCollectiveTypeCount * kReduceOpCount - 1 - 4 * 3) * 7 * 4 * 2 * 3);
}

// Rank 0 prepares its in-place all-reduce once and runs it again and again; rank 1 calls the
// public entry, which prepares every call. Equal calls give exact sums of fresh inputs each
// round (the prepared call reads its data at run time); rank 1 at another offset or with
// another count fails on both ranks with INVALID_ARGUMENT, and the allocation stays usable.
TEST(PreparedCallTest, PreparedAndFreshRanksAgreeAndMismatchesFailBoth) {
  auto mem = SymmetricHostMemory::Create(2, 1 << 16);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const uint64_t seed = SplitMix64(testing::RunSeed() ^ 0x9e9e);
  const auto outcomes = RunRanks(2, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(1)));
    std::byte* region = mv->own_data();
    constexpr size_t kCount = 256;
    for (const Algorithm algorithm : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
      PreparedCollective prepared;
      const TensorArgs t{region, region, kCount, DataType::kInt32};
      RETURN_IF_ERROR(PrepareAllReduce(mv->view(), absl::MakeConstSpan(&t, 1), ReduceOp::kSum,
                                       algorithm, &prepared));
      // Rank 1's call in each round (offset in elements, count) and whether it equals rank 0's.
      struct Round {
        size_t offset;
        size_t count;
        bool agree;
      };
      for (const Round round :
           {Round{0, kCount, true}, Round{1024, kCount, false}, Round{0, kCount, true},
            Round{0, kCount - 1, false}, Round{0, kCount, true}}) {
        const uint64_t s = SplitMix64(seed + round.offset + round.count);
        std::byte* mine = rank == 1 ? region + round.offset * 4 : region;
        const size_t count = rank == 1 ? round.count : kCount;
        FillInputs(DataType::kInt32, s, rank, 0, count, mine);
        const absl::Status status =
            rank == 0 ? AllReducePrepared(mv->view(), prepared, NanCheck::kOff, nullptr)
                      : AllReduce(mv->view(), mine, mine, count, DataType::kInt32, ReduceOp::kSum,
                                  algorithm, NanCheck::kOff, nullptr);
        const std::string what =
            absl::StrCat("algorithm ", static_cast<int>(algorithm), ", rank 1 at offset ",
                         round.offset, " count ", round.count);
        if (round.agree) {
          if (!status.ok()) return absl::InternalError(absl::StrCat(what, ": ", status.ToString()));
          RETURN_IF_ERROR(
              CheckReduced(DataType::kInt32, ReduceOp::kSum, s, 2, mine, 0, count, what));
        } else if (status.code() != absl::StatusCode::kInvalidArgument ||
                   !absl::StrContains(status.message(), "ranks disagree on the call")) {
          return absl::InternalError(absl::StrCat(
              what, ": want INVALID_ARGUMENT (ranks disagree), got ", status.ToString()));
        }
      }
    }
    return std::string("ok");
  });
  testing::ExpectAllOk(outcomes);
}

// A prepared call runs only on the view it was validated against: another view of the same
// memory (other pointer arrays) is INVALID_ARGUMENT, as is a call whose preparation failed
// (with the public entry's own error) or that was never prepared.
TEST(PreparedCallTest, RunsOnlyOnItsViewAndOnlyWhenPrepared) {
  auto mem = SymmetricHostMemory::Create(1, 1 << 12);
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto a = MappedView::Map(*mem, 0, nullptr, absl::Now() + absl::Minutes(1));
  auto b = MappedView::Map(*mem, 0, nullptr, absl::Now() + absl::Minutes(1));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> in = {1, 2, 3}, out(3);
  const TensorArgs t{in.data(), out.data(), in.size(), DataType::kFloat32};
  PreparedCollective p;
  EXPECT_EQ(AllReducePrepared((*a)->view(), p, NanCheck::kOff, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PrepareAllReduce((*a)->view(), absl::MakeConstSpan(&t, 1), ReduceOp::kMax,
                               Algorithm::kTwoShot, &p)
                  .ok());
  CollectiveResult r;
  ASSERT_TRUE(AllReducePrepared((*a)->view(), p, NanCheck::kOn, &r).ok());
  EXPECT_EQ(out, in);
  const absl::Status other = AllReducePrepared((*b)->view(), p, NanCheck::kOff, nullptr);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_TRUE(absl::StrContains(other.message(), "another view")) << other;
  // The same arrays with another data size is another view too.
  HostCommView shrunk = (*a)->view();
  shrunk.data_bytes -= 64;
  EXPECT_EQ(AllReducePrepared(shrunk, p, NanCheck::kOff, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  // Too large for the region: the public entry's error, and the struct cannot be run.
  const TensorArgs big{in.data(), out.data(), size_t{1} << 20, DataType::kFloat32};
  const absl::Status prepare_error = PrepareAllReduce((*a)->view(), absl::MakeConstSpan(&big, 1),
                                                      ReduceOp::kMax, Algorithm::kTwoShot, &p);
  const absl::Status public_error =
      AllReduce((*a)->view(), big.input, big.output, big.count, big.dtype, ReduceOp::kMax,
                Algorithm::kTwoShot, NanCheck::kOff, nullptr);
  EXPECT_EQ(prepare_error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prepare_error, public_error);
  const absl::Status stale = AllReducePrepared((*a)->view(), p, NanCheck::kOff, nullptr);
  EXPECT_EQ(stale.code(), absl::StatusCode::kInvalidArgument) << stale;
  EXPECT_TRUE(absl::StrContains(stale.message(), "not prepared")) << stale;
}

}  // namespace
}  // namespace commd::kernels
