// Every CPU collective x dtype x op x world size x size, each rank a real process over
// memfd-backed symmetric memory, checked against an independent float64 reference.
#include "kernels/host/collectives.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/host/test_support.h"

namespace commd::kernels {
namespace {

using testing::CheckCopied;
using testing::CheckPoisoned;
using testing::CheckReduced;
using testing::Digest;
using testing::FillInputs;
using testing::MappedView;
using testing::Poison;
using testing::RankOutcome;
using testing::RunRanks;
using testing::SplitMix64;
using testing::SymmetricHostMemory;

enum class Mode {
  kAllReduceOneShot,
  kAllReduceTwoShot,
  kAllReduceOneShotInPlace,
  kAllReduceTwoShotInPlace,
  kAllGather,
  kAllGatherInPlace,
  kReduceScatter,
  kReduceScatterInPlace,
  kAllReduceCoalesced,
  kAllGatherCoalesced,
  kReduceScatterCoalesced,
  kBroadcast,
  kBroadcastInPlace,
  kAllToAll,
  kAllToAllInPlace,
};

const char* ModeName(Mode m) {
  static const char* const kNames[] = {"AllReduceOneShot",
                                       "AllReduceTwoShot",
                                       "AllReduceOneShotInPlace",
                                       "AllReduceTwoShotInPlace",
                                       "AllGather",
                                       "AllGatherInPlace",
                                       "ReduceScatter",
                                       "ReduceScatterInPlace",
                                       "AllReduceCoalesced",
                                       "AllGatherCoalesced",
                                       "ReduceScatterCoalesced",
                                       "Broadcast",
                                       "BroadcastInPlace",
                                       "AllToAll",
                                       "AllToAllInPlace"};
  return kNames[static_cast<int>(m)];
}

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll };

Kind KindOf(Mode m) {
  switch (m) {
    case Mode::kAllGather:
    case Mode::kAllGatherInPlace:
    case Mode::kAllGatherCoalesced:
      return Kind::kAllGather;
    case Mode::kReduceScatter:
    case Mode::kReduceScatterInPlace:
    case Mode::kReduceScatterCoalesced:
      return Kind::kReduceScatter;
    case Mode::kBroadcast:
    case Mode::kBroadcastInPlace:
      return Kind::kBroadcast;
    case Mode::kAllToAll:
    case Mode::kAllToAllInPlace:
      return Kind::kAllToAll;
    default:
      return Kind::kAllReduce;
  }
}

bool InPlace(Mode m) {
  return m == Mode::kAllReduceOneShotInPlace || m == Mode::kAllReduceTwoShotInPlace ||
         m == Mode::kAllGatherInPlace || m == Mode::kReduceScatterInPlace ||
         m == Mode::kBroadcastInPlace || m == Mode::kAllToAllInPlace;
}

bool Coalesced(Mode m) {
  return m == Mode::kAllReduceCoalesced || m == Mode::kAllGatherCoalesced ||
         m == Mode::kReduceScatterCoalesced;
}

constexpr size_t kDataBytes = size_t{2} << 20;
constexpr size_t kGuardBytes = 256;

// One tensor of a case, with its own seed and (private) buffers.
struct CaseTensor {
  size_t count;
  DataType dtype;
  uint64_t seed;
  std::vector<std::byte> input;   // empty when in place; broadcast: the buffer + guard
  std::vector<std::byte> output;  // out bytes + guard; empty when the output is the input
  size_t offset = 0;              // staging offset when in place
};

size_t InCount(Kind k, const CaseTensor& t, int w) {
  return k == Kind::kReduceScatter || k == Kind::kAllToAll ? t.count * w : t.count;
}
size_t OutCount(Kind k, const CaseTensor& t, int w) {
  return k == Kind::kAllGather || k == Kind::kAllToAll ? t.count * w : t.count;
}

// The kinds whose output is their input (in place, or a broadcast's buffer).
bool OutputIsInput(Kind k, bool in_place) {
  return k == Kind::kBroadcast || (in_place && k == Kind::kAllReduce);
}

struct Case {
  Mode mode;
  ReduceOp op;
  Algorithm algorithm;
  bool in_place;
  std::vector<CaseTensor> tensors;
  int root = 0;  // broadcast
};

// Poisons the own data region and every output, writes the inputs.
void Prepare(MappedView& mv, Case& c) {
  const HostCommView& v = mv.view();
  const Kind kind = KindOf(c.mode);
  Poison(mv.own_data(), v.data_bytes);
  size_t offset = 0;
  for (CaseTensor& t : c.tensors) {
    const size_t es = DataTypeSize(t.dtype);
    const size_t in_count = InCount(kind, t, v.world_size);
    // The documented packing (64-byte aligned from 0): where in-place inputs go, and where
    // the collective stages the others.
    t.offset = offset;
    offset = (offset + in_count * es + 63) / 64 * 64;
    if (c.in_place) {
      FillInputs(t.dtype, t.seed, v.rank, 0, in_count, mv.own_data() + t.offset);
    } else {
      // A broadcast's buffer is also its output: guard it like one.
      t.input.resize(in_count * es + (kind == Kind::kBroadcast ? kGuardBytes : 0));
      Poison(t.input.data(), t.input.size());
      FillInputs(t.dtype, t.seed, v.rank, 0, in_count, t.input.data());
    }
    if (!OutputIsInput(kind, c.in_place)) {
      t.output.resize(OutCount(kind, t, v.world_size) * es + kGuardBytes);
      Poison(t.output.data(), t.output.size());
    }
  }
}

absl::Status RunCase(MappedView& mv, Case& c, CollectiveResult* result) {
  std::vector<TensorArgs> args;
  for (CaseTensor& t : c.tensors) {
    std::byte* staged = mv.own_data() + t.offset;
    void* in = c.in_place ? staged : t.input.data();
    void* out = t.output.empty() ? in : t.output.data();
    args.push_back(TensorArgs{in, out, t.count, t.dtype});
  }
  const HostCommView& v = mv.view();
  const TensorArgs& a = args[0];
  if (!Coalesced(c.mode)) {
    switch (KindOf(c.mode)) {
      case Kind::kAllReduce:
        return AllReduce(v, a.input, a.output, a.count, a.dtype, c.op, c.algorithm, NanCheck::kOn,
                         result);
      case Kind::kAllGather:
        return AllGather(v, a.input, a.output, a.count, a.dtype, NanCheck::kOn, result);
      case Kind::kReduceScatter:
        return ReduceScatter(v, a.input, a.output, a.count, a.dtype, c.op, NanCheck::kOn, result);
      case Kind::kBroadcast:
        return Broadcast(v, a.output, a.count, a.dtype, c.root, NanCheck::kOn, result);
      case Kind::kAllToAll:
        return AllToAll(v, a.input, a.output, a.count, a.dtype, NanCheck::kOn, result);
    }
  }
  switch (KindOf(c.mode)) {
    case Kind::kAllReduce:
      return AllReduceCoalesced(v, args, c.op, c.algorithm, NanCheck::kOn, result);
    case Kind::kAllGather:
      return AllGatherCoalesced(v, args, NanCheck::kOn, result);
    case Kind::kReduceScatter:
      return ReduceScatterCoalesced(v, args, c.op, NanCheck::kOn, result);
    default:
      break;
  }
  return absl::InternalError("unreachable");
}

absl::Status Verify(MappedView& mv, const Case& c, const std::string& label, uint64_t* digest) {
  const HostCommView& v = mv.view();
  const Kind kind = KindOf(c.mode);
  size_t staged_end = 0;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const CaseTensor& t = c.tensors[i];
    const size_t es = DataTypeSize(t.dtype);
    const size_t out_bytes = OutCount(kind, t, v.world_size) * es;
    const std::string what = absl::StrCat(label, " tensor ", i);
    const std::byte* out = !t.output.empty() ? t.output.data()
                           : c.in_place      ? mv.own_data() + t.offset
                                             : t.input.data();
    switch (kind) {
      case Kind::kAllReduce:
        RETURN_IF_ERROR(CheckReduced(t.dtype, c.op, t.seed, v.world_size, out, 0, t.count, what));
        break;
      case Kind::kAllGather:
        for (int p = 0; p < v.world_size; ++p) {
          RETURN_IF_ERROR(CheckCopied(t.dtype, t.seed, p, out + p * t.count * es, 0, t.count,
                                      absl::StrCat(what, " block ", p)));
        }
        break;
      case Kind::kReduceScatter:
        RETURN_IF_ERROR(CheckReduced(t.dtype, c.op, t.seed, v.world_size, out,
                                     static_cast<size_t>(v.rank) * t.count, t.count, what));
        break;
      case Kind::kBroadcast:
        RETURN_IF_ERROR(CheckCopied(t.dtype, t.seed, c.root, out, 0, t.count,
                                    absl::StrCat(what, " from root ", c.root)));
        break;
      case Kind::kAllToAll:
        for (int p = 0; p < v.world_size; ++p) {
          RETURN_IF_ERROR(CheckCopied(t.dtype, t.seed, p, out + p * t.count * es,
                                      static_cast<size_t>(v.rank) * t.count, t.count,
                                      absl::StrCat(what, " block ", p)));
        }
        break;
    }
    if (!t.output.empty() || !c.in_place) {  // outputs outside the data region have a guard
      RETURN_IF_ERROR(CheckPoisoned(out + out_bytes, kGuardBytes, what + " guard after output"));
    }
    *digest = Digest(out, out_bytes, *digest);
    // A broadcast from outside the data regions stages nothing but on the root.
    const bool staged = !(kind == Kind::kBroadcast && !c.in_place && v.rank != c.root);
    if (staged) staged_end = std::max(staged_end, t.offset + InCount(kind, t, v.world_size) * es);
  }
  return CheckPoisoned(mv.own_data() + staged_end, v.data_bytes - staged_end,
                       label + " data region beyond the staged inputs");
}

struct Param {
  Mode mode;
  int world_size;
  DataType dtype;
};

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(ModeName(info.param.mode), "_W", info.param.world_size, "_",
                      DataTypeName(info.param.dtype));
}

// Element counts: one element, odd, not divisible by the world size, 4 KiB, 1 MiB (for
// all-gather and reduce-scatter 1 MiB over all ranks; coalesced 512 KiB per tensor).
std::vector<size_t> Counts(const Param& p) {
  const size_t es = DataTypeSize(p.dtype);
  const size_t w = static_cast<size_t>(p.world_size);
  size_t big = (size_t{1} << 20) / es;
  if (KindOf(p.mode) != Kind::kAllReduce && KindOf(p.mode) != Kind::kBroadcast) big /= w;
  if (Coalesced(p.mode)) big /= 2;
  return {1, 7, 5 * w + 1, 4096 / es, big};
}

Case MakeCase(const Param& p, ReduceOp op, size_t count, uint64_t seed, int index) {
  Case c{p.mode, op, Algorithm::kOneShot, InPlace(p.mode), {}};
  if (p.mode == Mode::kAllReduceTwoShot || p.mode == Mode::kAllReduceTwoShotInPlace) {
    c.algorithm = Algorithm::kTwoShot;
  }
  c.tensors.push_back(CaseTensor{count, p.dtype, seed, {}, {}});
  c.root = index % 2 == 0 ? 0 : p.world_size - 1;  // broadcast: the first and the last rank
  if (Coalesced(p.mode)) {
    // Alternate algorithm and in-place placement; mix in a tensor of another type.
    c.algorithm = index % 2 ? Algorithm::kTwoShot : Algorithm::kOneShot;
    c.in_place = (index / 2) % 2 == 1;
    c.tensors.push_back(CaseTensor{1, p.dtype, SplitMix64(seed + 1), {}, {}});
    c.tensors.push_back(CaseTensor{count / 2 + 3, p.dtype, SplitMix64(seed + 2), {}, {}});
    c.tensors.push_back(CaseTensor{5, DataType::kInt32, SplitMix64(seed + 3), {}, {}});
  }
  return c;
}

class HostCollectivesTest : public ::testing::TestWithParam<Param> {};

TEST_P(HostCollectivesTest, MatchesFloat64Reference) {
  const Param p = GetParam();
  const uint64_t base =
      SplitMix64(testing::RunSeed() ^ (static_cast<uint64_t>(p.mode) << 40) ^
                 (static_cast<uint64_t>(p.world_size) << 32) ^ static_cast<uint64_t>(p.dtype));
  auto mem = SymmetricHostMemory::Create(p.world_size, kDataBytes);
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::vector<ReduceOp> ops = {ReduceOp::kSum};
  // Only all-reduce and reduce-scatter reduce: every op the type has (not bool's avg, not the
  // floats' bitwise ops).
  if (KindOf(p.mode) == Kind::kAllReduce || KindOf(p.mode) == Kind::kReduceScatter) {
    for (int o = 1; o < kReduceOpCount; ++o) {
      if (ReduceOpApplies(static_cast<ReduceOp>(o), p.dtype))
        ops.push_back(static_cast<ReduceOp>(o));
    }
  }
  const std::vector<size_t> counts = Counts(p);

  const std::vector<RankOutcome> outcomes =
      RunRanks(p.world_size, [&](int rank) -> absl::StatusOr<std::string> {
        ASSIGN_OR_RETURN(auto mv,
                         MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Seconds(120)));
        uint64_t digest = 0;
        int index = 0;
        for (ReduceOp op : ops) {
          for (size_t count : counts) {
            // 1 MiB (the last count) with sum and avg, whose fp16/bf16 loops have vector fast
            // paths; the other ops share the portable loops, which the smaller counts cover.
            if (count == counts.back() && op != ReduceOp::kSum && op != ReduceOp::kAvg) continue;
            Case c = MakeCase(p, op, count, SplitMix64(base + index), index);
            const std::string label = absl::StrCat(ModeName(p.mode), " ", ReduceOpName(op),
                                                   " count ", count, " case ", index);
            ++index;
            Prepare(*mv, c);
            CollectiveResult result;
            result.nonfinite_count = 12345;
            if (absl::Status s = RunCase(*mv, c, &result); !s.ok()) {
              return absl::InternalError(absl::StrCat(label, ": ", s.ToString()));
            }
            if (result.nonfinite_count != 0) {
              return absl::InternalError(absl::StrCat(label, ": nonfinite_count ",
                                                      result.nonfinite_count, " for finite input"));
            }
            RETURN_IF_ERROR(Verify(*mv, c, label, &digest));
          }
        }
        return absl::StrCat(digest);
      });
  testing::ExpectAllOk(outcomes);
  if (KindOf(p.mode) == Kind::kAllReduce || KindOf(p.mode) == Kind::kBroadcast) {
    for (const RankOutcome& o : outcomes) {
      EXPECT_EQ(o.report, outcomes[0].report)
          << ModeName(p.mode) << " results differ between rank 0 and rank " << o.rank;
    }
  }
}

// A few 64 MiB cases (the matrix above stops at 1 MiB to stay fast on small machines).
struct LargeParam {
  Param param;
  ReduceOp op;
};

class HostCollectivesLargeTest : public ::testing::TestWithParam<LargeParam> {};

TEST_P(HostCollectivesLargeTest, SixtyFourMiB) {
  const Param p = GetParam().param;
  const ReduceOp op = GetParam().op;
  constexpr size_t kBytes = size_t{64} << 20;
  size_t count = kBytes / DataTypeSize(p.dtype);
  if (KindOf(p.mode) != Kind::kAllReduce && KindOf(p.mode) != Kind::kBroadcast) {
    count /= p.world_size;
  }
  const uint64_t seed = SplitMix64(testing::RunSeed() ^ 0x64);
  auto mem = SymmetricHostMemory::Create(p.world_size, kBytes + 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const absl::Time start = absl::Now();
  const auto outcomes = RunRanks(p.world_size, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(2)));
    Case c = MakeCase(p, op, count, seed, 0);
    Prepare(*mv, c);
    CollectiveResult result;
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(RunCase(*mv, c, &result));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    uint64_t digest = 0;
    RETURN_IF_ERROR(Verify(*mv, c, ModeName(p.mode), &digest));
    return absl::StrCat(seconds);
  });
  testing::ExpectAllOk(outcomes);
  std::printf("%s W%d %s %s 64 MiB: collective %s s on rank 0, test %.2f s\n", ModeName(p.mode),
              p.world_size, DataTypeName(p.dtype), ReduceOpName(op), outcomes[0].report.c_str(),
              absl::ToDoubleSeconds(absl::Now() - start));
}

INSTANTIATE_TEST_SUITE_P(
    Large, HostCollectivesLargeTest,
    ::testing::Values(LargeParam{{Mode::kAllReduceTwoShotInPlace, 4, DataType::kBFloat16},
                                 ReduceOp::kSum},
                      LargeParam{{Mode::kAllReduceOneShot, 2, DataType::kFloat32}, ReduceOp::kAvg},
                      LargeParam{{Mode::kAllGather, 2, DataType::kInt32}, ReduceOp::kSum},
                      LargeParam{{Mode::kReduceScatter, 3, DataType::kFloat16}, ReduceOp::kMax},
                      LargeParam{{Mode::kBroadcastInPlace, 3, DataType::kBFloat16}, ReduceOp::kSum},
                      LargeParam{{Mode::kAllToAll, 4, DataType::kInt64}, ReduceOp::kSum}),
    [](const auto& info) {
      return absl::StrCat(ModeName(info.param.param.mode), "_W", info.param.param.world_size, "_",
                          DataTypeName(info.param.param.dtype), "_", ReduceOpName(info.param.op));
    });

// Two-shot pushes each rank's reduced chunk into its peers' regions 8 KiB at a time
// (collectives.cc kPushBlockBytes): counts below the world size (empty chunks), odd counts,
// chunks ending one element before, on and after a push block's edge, at every world size
// from 2 to 8; in place, outside, and an in-place input with an outside output.
class TwoShotPushTest : public ::testing::TestWithParam<int> {};

TEST_P(TwoShotPushTest, ChunkAndBlockEdges) {
  const int w = GetParam();
  const uint64_t base = SplitMix64(testing::RunSeed() ^ 0x2507 ^ static_cast<uint64_t>(w));
  auto mem = SymmetricHostMemory::Create(w, kDataBytes);
  ASSERT_TRUE(mem.ok()) << mem.status();
  const auto outcomes = RunRanks(w, [&](int rank) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto mv, MappedView::Map(*mem, rank, nullptr, absl::Now() + absl::Minutes(2)));
    uint64_t digest = 0;
    int index = 0;
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
      const size_t block = (size_t{8} << 10) / DataTypeSize(dtype);
      const size_t ws = static_cast<size_t>(w);
      for (size_t count : {ws - 1, ws, 2 * ws + 1, block * ws - 1, block * ws, block * ws + 1,
                           2 * block * ws + ws - 1, 3 * block * ws + 7}) {
        for (int placement = 0; placement < 3; ++placement) {
          const ReduceOp op = index % 2 ? ReduceOp::kMax : ReduceOp::kSum;
          Case c{placement == 0 ? Mode::kAllReduceTwoShot : Mode::kAllReduceTwoShotInPlace,
                 op,
                 Algorithm::kTwoShot,
                 placement != 0,
                 {CaseTensor{count, dtype, SplitMix64(base + index), {}, {}}}};
          const std::string label =
              absl::StrCat("two-shot ", DataTypeName(dtype), " ", ReduceOpName(op), " count ",
                           count, " placement ", placement);
          ++index;
          Prepare(*mv, c);
          if (placement == 2) {  // in-place input, output outside the data regions
            CaseTensor& t = c.tensors[0];
            t.output.resize(count * DataTypeSize(dtype) + kGuardBytes);
            Poison(t.output.data(), t.output.size());
          }
          CollectiveResult result;
          if (absl::Status s = RunCase(*mv, c, &result); !s.ok()) {
            return absl::InternalError(absl::StrCat(label, ": ", s.ToString()));
          }
          RETURN_IF_ERROR(Verify(*mv, c, label, &digest));
        }
      }
    }
    return absl::StrCat(digest);
  });
  testing::ExpectAllOk(outcomes);
  for (const RankOutcome& o : outcomes) {
    EXPECT_EQ(o.report, outcomes[0].report) << "results differ between rank 0 and rank " << o.rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, TwoShotPushTest, ::testing::Range(2, 9),
                         [](const auto& info) { return absl::StrCat("W", info.param); });

std::vector<Param> AllParams() {
  std::vector<Param> params;
  for (int m = 0; m <= static_cast<int>(Mode::kAllToAllInPlace); ++m) {
    for (int w : {2, 3, 4, 8}) {
      for (const DataType t : kCollectiveTypes) params.push_back(Param{static_cast<Mode>(m), w, t});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(All, HostCollectivesTest, ::testing::ValuesIn(AllParams()), ParamName);

}  // namespace
}  // namespace commd::kernels
