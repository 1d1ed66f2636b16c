// One rank of collective_test: joins group "c" of the daemon in $COMMD_RUNTIME_DIR and runs
// a mode's collectives through the SDK, checking every output against a float64 reference
// computed from every rank's inputs (regenerated here from the shared seed).
//
//   collective_rank <rank> <world> <seed> <mode>
//   mode: matrix | large | repeat[:N] | invalid | nan | nan_group | nan_sampled3 | nan_fail |
//         nan_off_fail | mismatch | abort | cuda | host_matrix | host_large | host_overlapping |
//         host_invalid | host_nan_fail | matmul | matmul_invalid | matmul_nan_fail |
//         matmul_missing_rank | cuda_matmul | part_of | part_of_nan_fail
// (host_*: the overloads on ordinary host memory, with a symmetric buffer as the staging area.)
// (cuda: rank r on Device::Cuda(r), stream-ordered collectives; needs a CUDA build and a GPU
// per rank.)
// Prints "OK <mode>" and exits 0, or prints each mismatch and exits 1. With
// $COLLECTIVE_RANK_HOLD set, a rank prints "HOLDING" once done and waits for that file to
// exist before it leaves the group (so the daemon can still read its control block).
//
// A mode is a row of kModes (its name, its function, and optionally its group options and
// buffer size) plus that function, which gets the rank's Run: adding a mode touches nothing
// else.
#include "tests/integration/collective_rank.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "commd/commd.h"
#include "common/control_block.h"
#include "kernels/float16.h"

#ifdef COMMD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace collective_rank {

namespace k = commd::kernels;

// Input value i of rank r for test `tag`: nonzero; exactly representable in the type.
double Input(const Run& run, int r, uint64_t tag, size_t i, DataType t) {
  std::mt19937_64 g(run.args.seed ^ (tag * 0x9E3779B97F4A7C15ull) ^ (uint64_t(r) << 48) ^ i);
  const uint64_t v = g();
  const int64_t m = static_cast<int64_t>(v % 32) - 16;
  const int64_t nz = m >= 0 ? m + 1 : m;  // -16..-1, 1..16
  switch (t) {
    case DataType::kFloat32:
      return static_cast<float>((static_cast<double>(v >> 11) / 9007199254740992.0 + 0.01) *
                                (nz > 0 ? 1 : -1));
    case DataType::kFloat64:
      return (static_cast<double>(v >> 11) / 9007199254740992.0 + 0.01) * (nz > 0 ? 1 : -1);
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return nz / 4.0;
    case DataType::kInt32:
      return static_cast<double>((static_cast<int32_t>((v >> 8) % 2000001) - 1000000) | 1);
    case DataType::kInt64:
      return static_cast<double>((static_cast<int64_t>((v >> 8) % 2000000001) - 1000000000) | 1);
    // The narrow types: no sum of up to 8 ranks leaves the type's range (the kernels' wrapping
    // is kernels_host_collectives_test's).
    case DataType::kInt8:
      return static_cast<double>(nz / 2 != 0 ? nz / 2 : nz);  // -8..8
    case DataType::kUInt8:
      return static_cast<double>(v % 31 + 1);  // 1..31
    case DataType::kInt16:
      return static_cast<double>(nz * 255);
    case DataType::kBool:
      return static_cast<double>((v >> 7) & 1);
    default:
      return 0;
  }
}

// Product and the bitwise ops of element i, as commd/vocabulary.h defines them: integers in
// wrapping 64-bit arithmetic stored as their low bits; floats multiplied in the kernels'
// accumulator (float, fp64's double) in rank order and rounded once to the type, so that
// fp16's product overflows to Inf as the kernels' does.
double ExactReference(const Run& run, uint64_t tag, size_t i, DataType t, ReduceOp op) {
  if (commd::IsFloatingPoint(t)) {
    double p64 = 1;
    float p32 = 1;
    for (int r = 0; r < run.args.world; ++r) {
      const double x = Input(run, r, tag, i, t);
      p64 *= x;
      p32 *= static_cast<float>(x);
    }
    if (t == DataType::kFloat64) return p64;
    if (t == DataType::kFloat16) return k::HalfToFloat(k::FloatToHalf(p32));
    if (t == DataType::kBFloat16) return k::BFloat16ToFloat(k::FloatToBFloat16(p32));
    return p32;
  }
  uint64_t acc = static_cast<uint64_t>(static_cast<int64_t>(Input(run, 0, tag, i, t)));
  for (int r = 1; r < run.args.world; ++r) {
    const uint64_t x = static_cast<uint64_t>(static_cast<int64_t>(Input(run, r, tag, i, t)));
    switch (op) {
      case ReduceOp::kProduct:
        acc *= x;
        break;
      case ReduceOp::kBAnd:
        acc &= x;
        break;
      case ReduceOp::kBOr:
        acc |= x;
        break;
      default:
        acc ^= x;
        break;
    }
  }
  return Narrow(t, acc);
}

// Reference of element i over every rank's input; `abs_sum` for the float error bound.
double Reference(const Run& run, uint64_t tag, size_t i, DataType t, ReduceOp op, double* abs_sum) {
  if (op == ReduceOp::kProduct || op == ReduceOp::kBAnd || op == ReduceOp::kBOr ||
      op == ReduceOp::kBXor) {
    *abs_sum = 0;
    return ExactReference(run, tag, i, t, op);
  }
  double acc = 0;
  *abs_sum = 0;
  for (int r = 0; r < run.args.world; ++r) {
    const double x = Input(run, r, tag, i, t);
    *abs_sum += std::fabs(x);
    if (r == 0)
      acc = x;
    else if (op == ReduceOp::kMin)
      acc = std::min(acc, x);
    else if (op == ReduceOp::kMax)
      acc = std::max(acc, x);
    else
      acc += x;
  }
  if (op == ReduceOp::kAvg) {
    acc /= run.args.world;
    if (!commd::IsFloatingPoint(t)) acc = std::trunc(acc);
  }
  if (t == DataType::kBool) acc = acc != 0 ? 1 : 0;  // sum: or; min and max stay 0 or 1
  return acc;
}

bool Close(const Run& run, double got, double want, double abs_sum, DataType t, ReduceOp op) {
  if (!commd::IsFloatingPoint(t)) return got == want;
  if (op == ReduceOp::kMin || op == ReduceOp::kMax || got == want) return got == want;
  // Any summation order: |error| <= (n - 1) * u * sum|x| plus the final rounding.
  const double u = t == DataType::kFloat64   ? 0x1p-53
                   : t == DataType::kFloat32 ? 0x1p-24
                   : t == DataType::kFloat16 ? 0x1p-11
                                             : 0x1p-8;
  // A product's reference multiplies as the kernels do (abs_sum 0): the last term alone.
  return std::fabs(got - want) <= (run.args.world + 1) * u * abs_sum + u * std::fabs(want) + 1e-30;
}

// Fails `what` unless `n` elements of `got` (starting at reference element `first`) match
// the reference of `tag`.
void ExpectReduced(Run& run, const std::string& what, const void* got, uint64_t tag, size_t first,
                   size_t n, DataType t, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    double abs_sum;
    const double want = Reference(run, tag, first + i, t, op, &abs_sum);
    if (!Close(run, Load(got, i, t), want, abs_sum, t, op)) {
      run.Fail(what + " [" + std::to_string(i) + "] " + std::to_string(Load(got, i, t)) + " want " +
               std::to_string(want));
      return;
    }
  }
}

void Poison(void* p, size_t bytes) { std::memset(p, 0xA5, bytes); }

std::string Describe(const char* what, DataType t, ReduceOp op, size_t n) {
  return std::string(what) + " type " + std::to_string(int(t)) + " op " + std::to_string(int(op)) +
         " n " + std::to_string(n);
}

// Host memory: out of place for sum and min, in place on the input for avg and max.
void AllReduceOne(Run& run, size_t n, DataType t, ReduceOp op) {
  const uint64_t tag = ++run.tag;
  void* in = run.input();
  void* out = op == ReduceOp::kSum || op == ReduceOp::kMin ? run.output() : in;
  Poison(in, run.bytes());
  Poison(out, run.bytes());
  for (size_t i = 0; i < n; ++i) Store(in, i, t, Input(run, run.args.rank, tag, i, t));
  run.Check("all-reduce", run.host_memory ? run.g.AllReduce(in, out, n, t, op, run.in)
                                          : run.g.AllReduce(run.in, n, t, op));
  ExpectReduced(run, Describe("all-reduce", t, op, n), run.host_memory ? out : in, tag, 0, n, t,
                op);
}

// Fails `what` unless `got` holds every rank's `n` inputs of `tag`, by rank.
void ExpectGathered(Run& run, const std::string& what, const void* got, uint64_t tag, size_t n,
                    DataType t) {
  for (int r = 0; r < run.args.world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      double want = Input(run, r, tag, i, t);
      if (t == DataType::kFloat32) want = static_cast<float>(want);
      if (Load(got, r * n + i, t) != want) {
        run.Fail(what + " rank " + std::to_string(r) + " [" + std::to_string(i) + "]");
        return;
      }
    }
  }
}

void AllGatherOne(Run& run, size_t n, DataType t) {
  const uint64_t tag = ++run.tag;
  void *in = run.input(), *out = run.output();
  Poison(out, run.bytes());
  for (size_t i = 0; i < n; ++i) Store(in, i, t, Input(run, run.args.rank, tag, i, t));
  run.Check("all-gather", run.host_memory ? run.g.AllGather(in, out, n, t, run.in)
                                          : run.g.AllGather(run.in, run.out, n, t));
  ExpectGathered(run, "all-gather type " + std::to_string(int(t)) + " n " + std::to_string(n), out,
                 tag, n, t);
}

void ReduceScatterOne(Run& run, size_t n, DataType t, ReduceOp op) {
  const uint64_t tag = ++run.tag;
  const int rank = run.args.rank;
  void *in = run.input(), *out = run.output();
  Poison(out, run.bytes());
  for (size_t i = 0; i < n * run.args.world; ++i) Store(in, i, t, Input(run, rank, tag, i, t));
  run.Check("reduce-scatter", run.host_memory ? run.g.ReduceScatter(in, out, n, t, op, run.in)
                                              : run.g.ReduceScatter(run.in, run.out, n, t, op));
  ExpectReduced(run, Describe("reduce-scatter", t, op, n), out, tag, rank * n, n, t, op);
}

// Root's inputs of `tag` reach every rank's buffer (in place; the others' poisoned first).
void BroadcastOne(Run& run, size_t n, DataType t, int root) {
  const uint64_t tag = ++run.tag;
  void* buf = run.input();
  Poison(buf, run.bytes());
  if (run.args.rank == root) {
    for (size_t i = 0; i < n; ++i) Store(buf, i, t, Input(run, root, tag, i, t));
  }
  run.Check("broadcast", run.host_memory ? run.g.Broadcast(buf, n, t, root, run.in)
                                         : run.g.Broadcast(run.in, n, t, root));
  for (size_t i = 0; i < n; ++i) {
    double want = Input(run, root, tag, i, t);
    if (t == DataType::kFloat32) want = static_cast<float>(want);
    if (Load(buf, i, t) != want) {
      return run.Fail("broadcast type " + std::to_string(int(t)) + " root " + std::to_string(root) +
                      " n " + std::to_string(n) + " [" + std::to_string(i) + "]");
    }
  }
}

// Fails `what` unless chunk p of `got` is chunk `rank` of rank p's inputs of `tag`.
void ExpectExchanged(Run& run, const std::string& what, const void* got, uint64_t tag, size_t n,
                     DataType t) {
  for (int p = 0; p < run.args.world; ++p) {
    for (size_t i = 0; i < n; ++i) {
      double want = Input(run, p, tag, run.args.rank * n + i, t);
      if (t == DataType::kFloat32) want = static_cast<float>(want);
      if (Load(got, p * n + i, t) != want) {
        return run.Fail(what + " type " + std::to_string(int(t)) + " n " + std::to_string(n) +
                        " from rank " + std::to_string(p) + " [" + std::to_string(i) + "]");
      }
    }
  }
}

// Each rank's input of world x n elements is its inputs of `tag`.
void AllToAllOne(Run& run, size_t n, DataType t) {
  const uint64_t tag = ++run.tag;
  const int rank = run.args.rank, world = run.args.world;
  void *in = run.input(), *out = run.output();
  Poison(out, run.bytes());
  for (size_t i = 0; i < n * world; ++i) Store(in, i, t, Input(run, rank, tag, i, t));
  run.Check("all-to-all", run.host_memory ? run.g.AllToAll(in, out, n, t, run.in)
                                          : run.g.AllToAll(run.in, run.out, n, t));
  ExpectExchanged(run, "all-to-all", out, tag, n, t);
}

// ---- The modes: each a function of the rank's Run, named by a row of kModes. ----

// Every collective x type at 1 element, odd, not divisible by the world size, 4 KiB of fp32
// (broadcast from the first and the last rank), every op a type has at the two odd counts
// (the others reduce with sum: the ops share the loops, which the counts exercise); then a
// barrier and a coalesced all-reduce of three tensors of different types.
void Matrix(Run& run) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{1024}}) {
    const bool every_op = n == 7 || n == 4099;
    for (DataType t : commd::kCollectiveTypes) {
      for (int o = 0; o < (every_op ? commd::kReduceOpCount : 1); ++o) {
        const auto op = static_cast<ReduceOp>(o);
        if (!commd::ReduceOpApplies(op, t)) continue;  // bool's avg: Invalid's
        AllReduceOne(run, n, t, op);
        ReduceScatterOne(run, n, t, op);
      }
      AllGatherOne(run, n, t);
      AllToAllOne(run, n, t);
      for (int root : {0, run.args.world - 1}) BroadcastOne(run, n, t, root);
    }
  }
  run.Check("barrier", run.g.Barrier());
  const uint64_t tag = ++run.tag;
  std::vector<commd::CoalescedTensor> ts = {
      {0, 5, DataType::kFloat32}, {64, 3, DataType::kInt64}, {128, 9, DataType::kInt32}};
  Poison(run.in.data(), run.in.size());
  auto* base = static_cast<char*>(run.in.data());
  for (const auto& t : ts) {
    for (size_t i = 0; i < t.count; ++i)
      Store(base + t.offset, i, t.dtype, Input(run, run.args.rank, tag + t.offset, i, t.dtype));
  }
  run.Check("coalesced", run.g.AllReduceCoalesced(run.in, ts, ReduceOp::kSum));
  for (const auto& t : ts) {
    ExpectReduced(run, "coalesced", base + t.offset, tag + t.offset, 0, t.count, t.dtype,
                  ReduceOp::kSum);
  }
}

// 1 MiB all-reduces (fp32, bf16), a reduce-scatter and an all-gather of 2^18 + 1 elements.
void Large(Run& run) {
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
    AllReduceOne(run, (size_t{1} << 20) / Size(t), t, ReduceOp::kSum);
  }
  ReduceScatterOne(run, (size_t{1} << 18) + 1, DataType::kFloat32, ReduceOp::kSum);
  AllGatherOne(run, (size_t{1} << 18) + 1, DataType::kInt32);
}

// repeat[:N]: N (default 10,000) exact int all-reduces of 4 elements, stopping at a failure.
void Repeat(Run& run) {
  const int iterations = run.args.argument.empty() ? 10000 : std::atoi(run.args.argument.c_str());
  const int rank = run.args.rank, world = run.args.world;
  auto* p = static_cast<int32_t*>(run.in.data());
  for (int it = 0; it < iterations && run.failures == 0; ++it) {
    for (int i = 0; i < 4; ++i) p[i] = rank * 1000 + it + i;
    run.Check("repeat", run.g.AllReduce(run.in, 4, DataType::kInt32, ReduceOp::kSum));
    for (int i = 0; i < 4; ++i) {
      const int32_t want = 1000 * world * (world - 1) / 2 + world * (it + i);
      if (p[i] != want) run.Fail("repeat " + std::to_string(it));
    }
  }
}

// Fails `what` unless `s` is INVALID_ARGUMENT with `needle` in its message.
void ExpectInvalid(Run& run, const char* what, const absl::Status& s, const char* needle) {
  if (s.code() != absl::StatusCode::kInvalidArgument ||
      s.message().find(needle) == absl::string_view::npos)
    run.Fail(std::string(what) + ": " + s.ToString());
  else
    std::printf("rank %d: %s -> %s\n", run.args.rank, what, s.ToString().c_str());
}

// Group NaN settings the daemon rejects, naming the value and the allowed ones; a buffer of
// another group.
void InvalidGroupCalls(Run& run) {
  commd::GroupOptions bad{.name = "bad", .rank = run.args.rank, .world_size = run.args.world};
  bad.nan_sample_period = 2000000;
  ExpectInvalid(run, "group sample period", run.client.JoinGroup(bad).status(), "1 to 1000000");
  bad.nan_sample_period = 0;
  bad.nan_check = static_cast<commd::GroupOptions::NanCheck>(9);
  ExpectInvalid(run, "group nan check", run.client.JoinGroup(bad).status(), "nan check 9");
  bad.nan_check = commd::GroupOptions::NanCheck::kDefault;
  bad.nan_policy = static_cast<commd::GroupOptions::NanPolicy>(5);
  ExpectInvalid(run, "group nan policy", run.client.JoinGroup(bad).status(), "2 (fail)");
  auto other =
      run.client.JoinGroup({.name = "other", .rank = run.args.rank, .world_size = run.args.world});
  if (!other.ok()) return run.Fail("join other: " + other.status().ToString());
  auto ob = (*other)->AllocateSymmetric(64);
  if (!ob.ok()) return run.Fail("alloc other");
  ExpectInvalid(run, "foreign buffer", run.g.AllReduce(**ob, 1, DataType::kInt32, ReduceOp::kSum),
                "not allocated by this group");
}

// Calls the SDK rejects with INVALID_ARGUMENT and a message naming the allowed values, none
// of them touching the buffer.
void Invalid(Run& run) {
  commd::Group& g = run.g;
  std::memset(run.in.data(), 7, 16);
  const size_t too_many = run.in.size() / 4 + 1;
  ExpectInvalid(run, "count too large",
                g.AllReduce(run.in, too_many, DataType::kInt32, ReduceOp::kSum), "at most");
  ExpectInvalid(run, "bad dtype", g.AllReduce(run.in, 1, static_cast<DataType>(99), ReduceOp::kSum),
                "data type 99 is not one of float32, float16, bfloat16, int32, int64, float64, "
                "int8, uint8, bool, int16");
  ExpectInvalid(run, "recorded-only dtype",
                g.AllReduce(run.in, 1, DataType::kFloat8E4M3, ReduceOp::kSum),
                "data type float8_e4m3fn (10) is not one of float32, float16, bfloat16, int32, "
                "int64, float64, int8, uint8, bool, int16");
  ExpectInvalid(run, "op the type has not", g.AllReduce(run.in, 1, DataType::kBool, ReduceOp::kAvg),
                "reduce op avg is not defined on bool; allowed on bool: sum, min, max, product, "
                "band, bor, bxor");
  ExpectInvalid(run, "bad op", g.AllReduce(run.in, 1, DataType::kInt32, static_cast<ReduceOp>(9)),
                "reduce op 9 is not one of sum, avg, min, max, product, band, bor, bxor");
  ExpectInvalid(run, "same buffer", g.AllGather(run.in, run.in, 1, DataType::kInt32),
                "same buffer");
  ExpectInvalid(
      run, "out too small",
      g.AllGather(run.in, run.out, run.out.size() / 4 / run.args.world + 1, DataType::kInt32),
      "at most");
  ExpectInvalid(run, "broadcast root", g.Broadcast(run.in, 1, DataType::kInt32, run.args.world),
                ("root " + std::to_string(run.args.world) + " is out of range [0, " +
                 std::to_string(run.args.world - 1) + "]")
                    .c_str());
  ExpectInvalid(run, "broadcast negative root", g.Broadcast(run.in, 1, DataType::kInt32, -1),
                "is out of range");
  ExpectInvalid(run, "all-to-all same buffer", g.AllToAll(run.in, run.in, 1, DataType::kInt32),
                "same buffer");
  ExpectInvalid(
      run, "all-to-all input too small",
      g.AllToAll(run.in, run.out, run.in.size() / 4 / run.args.world + 1, DataType::kInt32),
      "at most");
  commd::CollectiveOptions o;
  o.nan_check = commd::CollectiveOptions::NanCheck::kSampled;
  o.nan_sample_period = 0;
  ExpectInvalid(run, "sample period", g.AllReduce(run.in, 1, DataType::kInt32, ReduceOp::kSum, o),
                "[1, 1000000]");
  o.nan_check = static_cast<commd::NanCheck>(4);
  ExpectInvalid(run, "call nan check", g.AllReduce(run.in, 1, DataType::kInt32, ReduceOp::kSum, o),
                "nan_check 4 is not one of default (0), off (1), on (2), sampled (3)");
  if (static_cast<unsigned char*>(run.in.data())[0] != 7)
    run.Fail("invalid call touched the buffer");
  InvalidGroupCalls(run);
}

// Per-call NaN check on, off and sampled every 4th, NaN at [5] of rank 0's 64 floats.
void Nan(Run& run) {
  auto* p = static_cast<float*>(run.in.data());
  auto once = [&](commd::CollectiveOptions o) {
    for (int i = 0; i < 64; ++i) p[i] = 1.0f;
    if (run.args.rank == 0) p[5] = NAN;
    uint64_t found = 99;
    o.nonfinite_count = &found;
    run.Check("nan", run.g.AllReduce(run.in, 64, DataType::kFloat32, ReduceOp::kSum, o));
    return found;
  };
  commd::CollectiveOptions on, off, sampled;
  on.nan_check = commd::CollectiveOptions::NanCheck::kOn;
  sampled.nan_check = commd::CollectiveOptions::NanCheck::kSampled;
  sampled.nan_sample_period = 4;
  const uint64_t want = run.args.rank == 0 ? 1 : 0;
  if (once(on) != want) run.Fail("nan on");
  if (once(off) != 0) run.Fail("nan off");
  int hits = 0;
  for (int i = 0; i < 40; ++i) hits += once(sampled) != 0;
  if (run.args.rank == 0 && hits != 10)
    run.Fail("sampled(4): " + std::to_string(hits) + " hits of 40");
  if (run.args.rank != 0 && hits != 0) run.Fail("sampled on a clean rank");
}

// NaN at [7] and Inf at [8] of rank 1's 64 floats when `plant`; every other value 1.
void PlantNan(Run& run, bool plant) {
  auto* p = static_cast<float*>(run.in.data());
  for (int i = 0; i < 64; ++i) p[i] = 1.0f;
  if (plant && run.args.rank == 1) {
    p[7] = NAN;
    p[8] = INFINITY;
  }
}

// One all-reduce of 64 floats with NaN/Inf on rank 1 when `plant`: the status, and what this
// rank and the group found.
struct NanRun {
  absl::Status status;
  uint64_t here = 99;
  int ranks = 99;
};
NanRun RunNan(Run& run, bool plant, commd::CollectiveOptions o = {}) {
  PlantNan(run, plant);
  NanRun r;
  o.nonfinite_count = &r.here;
  o.nonfinite_ranks = &r.ranks;
  r.status = run.g.AllReduce(run.in, 64, DataType::kFloat32, ReduceOp::kSum, o);
  return r;
}

// The group's default check from the daemon's config (on): 5 collectives with NaN on rank 1,
// then 3 clean ones; every rank sees rank 1's finding.
void NanGroupDefault(Run& run) {
  for (int i = 0; i < 8; ++i) {
    const NanRun r = RunNan(run, i < 5);
    run.Check("nan_group", r.status);
    const uint64_t here = i < 5 && run.args.rank == 1 ? 2 : 0;
    if (r.here != here || r.ranks != (i < 5 ? 1 : 0))
      run.Fail("nan_group " + std::to_string(i) + ": here " + std::to_string(r.here) + " ranks " +
               std::to_string(r.ranks));
  }
}

// The group samples every 3rd collective (GroupOptions): 10 of 30 consecutive ones check, on
// every rank alike.
void NanSampled(Run& run) {
  int hits = 0;
  for (int i = 0; i < 30; ++i) {
    const NanRun r = RunNan(run, true);
    run.Check("nan_sampled3", r.status);
    hits += r.ranks != 0;
  }
  if (hits != 10) run.Fail("sampled(3): " + std::to_string(hits) + " checks found NaN of 30");
}

// Fails `what` unless `s` is the DATA_LOSS of policy FAIL for `op` naming rank 1 first.
void ExpectNanFailure(Run& run, const std::string& what, const absl::Status& s, const char* op) {
  if (s.code() != absl::StatusCode::kDataLoss ||
      s.message().find(std::string(op) + " seq ") == absl::string_view::npos ||
      s.message().find("first rank 1") == absl::string_view::npos)
    run.Fail(what + ": " + s.ToString());
  else
    std::printf("rank %d: %s\n", run.args.rank, s.ToString().c_str());
}

// A broadcast checks the root's buffer only: NaN/Inf on root 1 fails it on every rank; the
// same buffer contents broadcast from root 0 (rank 1's NaN is about to be overwritten) pass.
void NanFailBroadcast(Run& run) {
  PlantNan(run, true);
  ExpectNanFailure(run, "nan_fail broadcast",
                   run.g.Broadcast(run.in, 64, DataType::kFloat32, /*root=*/1), "broadcast");
  PlantNan(run, true);
  run.Check("nan_fail broadcast from a clean root",
            run.g.Broadcast(run.in, 64, DataType::kFloat32, /*root=*/0));
  if (!std::isfinite(static_cast<float*>(run.in.data())[7])) run.Fail("nan_fail broadcast data");
}

// An all-to-all checks every rank's input: NaN/Inf in rank 1's fails it on every rank.
void NanFailAllToAll(Run& run) {
  PlantNan(run, true);  // [7] and [8] of rank 1: its blocks for ranks 0 and 1 (count 8)
  uint64_t here = 99;
  commd::CollectiveOptions o{.nonfinite_count = &here};
  ExpectNanFailure(run, "nan_fail all_to_all",
                   run.g.AllToAll(run.in, run.out, 8, DataType::kFloat32, o), "all_to_all");
  if (here != (run.args.rank == 1 ? 2u : 0u))
    run.Fail("nan_fail all_to_all counted " + std::to_string(here) + " here");
  PlantNan(run, false);
  run.Check("nan_fail all_to_all clean", run.g.AllToAll(run.in, run.out, 8, DataType::kFloat32));
}

// Policy FAIL (GroupOptions): DATA_LOSS on every rank naming rank 1; the buffer stays usable;
// a call that opts out of the check is not failed. Broadcast and all-to-all likewise.
void NanFail(Run& run) {
  const NanRun r = RunNan(run, true);
  if (r.status.code() != absl::StatusCode::kDataLoss ||
      r.status.message().find("first rank 1") == absl::string_view::npos ||
      r.status.message().find("all_reduce seq 1") == absl::string_view::npos)
    run.Fail("nan_fail: " + r.status.ToString());
  else
    std::printf("rank %d: %s\n", run.args.rank, r.status.ToString().c_str());
  const NanRun clean = RunNan(run, false);
  run.Check("nan_fail clean", clean.status);
  if (static_cast<float*>(run.in.data())[7] != static_cast<float>(run.args.world))
    run.Fail("nan_fail sum");
  commd::CollectiveOptions off;
  off.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  run.Check("nan_fail opted out", RunNan(run, true, off).status);
  NanFailBroadcast(run);
  NanFailAllToAll(run);
}

// Check off and policy FAIL (GroupOptions): NaN goes through unnoticed.
void NanOffFail(Run& run) {
  for (int i = 0; i < 5; ++i) {
    const NanRun r = RunNan(run, true);
    run.Check("nan_off_fail", r.status);
    if (r.here != 0 || r.ranks != 0) run.Fail("nan_off_fail found NaN with the check off");
  }
}

// Seq 1 agrees; seq 2: rank 0 reduces 100 floats, rank 1 200. Both must fail, naming both.
void Mismatch(Run& run) {
  run.Check("mismatch seq 1", RunNan(run, false).status);
  const absl::Status s =
      run.g.AllReduce(run.in, run.args.rank == 1 ? 200 : 100, DataType::kFloat32, ReduceOp::kSum);
  if (s.code() != absl::StatusCode::kInvalidArgument ||
      s.message().find("rank 0 has 100 x float32") == absl::string_view::npos ||
      s.message().find("rank 1 has 200 x float32") == absl::string_view::npos)
    run.Fail("mismatch: " + s.ToString());
  else
    std::printf("rank %d: MISMATCHED %s\n", run.args.rank, s.ToString().c_str());
}

// Rank 1 enters an all-reduce that rank 0 never joins; the test aborts the group.
void AbortWhileWaiting(Run& run) {
  if (run.args.rank != 1) return;
  std::printf("ENTERING\n");
  std::fflush(stdout);
  const absl::Status s = run.g.AllReduce(run.in, 64, DataType::kFloat32, ReduceOp::kSum);
  if (s.code() != absl::StatusCode::kAborted ||
      s.message().find("stop the collective test") == absl::string_view::npos)
    run.Fail("abort: " + s.ToString());
  else
    std::printf("rank %d: %s\n", run.args.rank, s.ToString().c_str());
}

#ifdef COMMD_HAVE_CUDA
void CudaCheck(Run& run, const char* what, cudaError_t e) {
  if (e != cudaSuccess) run.Fail(std::string(what) + ": " + cudaGetErrorString(e));
}

// Fills `n` inputs of `tag` into device buffer `dev`, runs `call` on `stream`, waits and
// copies `out_n` elements of `out` back.
template <typename Call>
std::vector<unsigned char> OnDevice(Run& run, cudaStream_t stream, uint64_t tag, void* dev,
                                    size_t n, DataType t, void* out, size_t out_n, Call call) {
  std::vector<unsigned char> host(std::max(n, out_n) * Size(t));
  for (size_t i = 0; i < n; ++i) Store(host.data(), i, t, Input(run, run.args.rank, tag, i, t));
  CudaCheck(run, "copy in",
            cudaMemcpyAsync(dev, host.data(), n * Size(t), cudaMemcpyHostToDevice, stream));
  run.Check("cuda collective", call());
  CudaCheck(run, "copy out",
            cudaMemcpyAsync(host.data(), out, out_n * Size(t), cudaMemcpyDeviceToHost, stream));
  CudaCheck(run, "sync", cudaStreamSynchronize(stream));
  return host;
}

// All-reduce one-shot (7) and two-shot (4099), all-gather, reduce-scatter and barrier on this
// rank's GPU, on a stream of its own, against the reference.
void CudaCollectives(Run& run, cudaStream_t stream, const commd::CollectiveOptions& o) {
  commd::Group& g = run.g;
  const int rank = run.args.rank, world = run.args.world;
  void* in = run.in.data();
  void* out = run.out.data();
  for (size_t n : {size_t{7}, size_t{4099}}) {
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      const uint64_t tag = ++run.tag;
      auto got = OnDevice(run, stream, tag, in, n, t, in, n,
                          [&] { return g.AllReduce(run.in, n, t, ReduceOp::kSum, o); });
      ExpectReduced(run, "cuda all-reduce", got.data(), tag, 0, n, t, ReduceOp::kSum);
    }
  }
  const size_t n = 1025;
  uint64_t tag = ++run.tag;
  auto got = OnDevice(run, stream, tag, in, n * world, DataType::kFloat32, out, n, [&] {
    return g.ReduceScatter(run.in, run.out, n, DataType::kFloat32, ReduceOp::kMax, o);
  });
  ExpectReduced(run, "cuda reduce-scatter", got.data(), tag, rank * n, n, DataType::kFloat32,
                ReduceOp::kMax);
  tag = ++run.tag;
  got = OnDevice(run, stream, tag, in, n, DataType::kInt32, out, n * world,
                 [&] { return g.AllGather(run.in, run.out, n, DataType::kInt32, o); });
  ExpectGathered(run, "cuda all-gather", got.data(), tag, n, DataType::kInt32);
  run.Check("cuda barrier", g.Barrier());
  CudaCheck(run, "barrier sync", cudaDeviceSynchronize());
}

// NaN on rank 1, counted on the device: the next call retires it into the nan counters.
void CudaNan(Run& run, cudaStream_t stream, commd::CollectiveOptions o) {
  commd::Group& g = run.g;
  std::vector<float> host(4, 1.0f);
  ExpectInvalid(
      run, "host memory on a CUDA group",
      g.AllReduce(host.data(), host.data(), 4, DataType::kFloat32, ReduceOp::kSum, run.in),
      "need a host group");
  uint64_t count = 0;
  o.nonfinite_count = &count;
  if (g.AllReduce(run.in, 1, DataType::kFloat32, ReduceOp::kSum, o).code() !=
      absl::StatusCode::kInvalidArgument)
    run.Fail("nonfinite_count on CUDA buffers was accepted");
  o.nonfinite_count = nullptr;
  o.nan_check = commd::CollectiveOptions::NanCheck::kOn;
  std::vector<float> nan(64, 1.0f);
  if (run.args.rank == 1) nan[3] = NAN;
  CudaCheck(run, "nan in", cudaMemcpy(run.in.data(), nan.data(), 64 * 4, cudaMemcpyHostToDevice));
  run.Check("cuda nan all-reduce", g.AllReduce(run.in, 64, DataType::kFloat32, ReduceOp::kSum, o));
  CudaCheck(run, "nan sync", cudaStreamSynchronize(stream));
  run.Check("cuda barrier after nan", g.Barrier());
  const auto* counters = reinterpret_cast<const commd::ControlBlockCounters*>(
      static_cast<const char*>(g.control_block()) + commd::kCountersOffset);
  if (counters->nan_checks != 1 || counters->nans_found != (run.args.rank == 1 ? 1u : 0u))
    run.Fail("cuda nan counters: checks " + std::to_string(counters->nan_checks) + " found " +
             std::to_string(counters->nans_found));
}

// The collectives on GPU `device` of this process, then NaN counted on the device reaching the
// control block once the next call finds the first complete.
void CudaOn(Run& run, int device) {
  CudaCheck(run, "set device", cudaSetDevice(device));
  cudaStream_t stream;
  CudaCheck(run, "stream", cudaStreamCreate(&stream));
  commd::CollectiveOptions o;
  o.cuda_stream = stream;
  CudaCollectives(run, stream, o);
  CudaNan(run, stream, o);
  CudaCheck(run, "final sync", cudaDeviceSynchronize());
  cudaStreamDestroy(stream);
}

void Cuda(Run& run) { CudaOn(run, GpuOfRank(run.args.rank)); }

// Every rank sees only its GPU (shared when ranks share one), as cuda:0 (CUDA_VISIBLE_DEVICES set
// by RemappedGpu).
void CudaRemapped(Run& run) { CudaOn(run, 0); }

// In-place one-shot all-reduces of two allocations (in, out) on two streams, enqueued back to
// back so they may run at once: each stream must have its own scratch.
void CudaTwoStreams(Run& run) {
  CudaCheck(run, "set device", cudaSetDevice(GpuOfRank(run.args.rank)));
  cudaStream_t streams[2];
  commd::SymmetricBuffer* bufs[2] = {&run.in, &run.out};
  uint64_t tags[2];
  const size_t n = 7;
  const DataType t = DataType::kFloat32;
  for (int k = 0; k < 2; ++k) {
    CudaCheck(run, "stream", cudaStreamCreate(&streams[k]));
    tags[k] = ++run.tag;
    std::vector<unsigned char> host(n * Size(t));
    for (size_t i = 0; i < n; ++i)
      Store(host.data(), i, t, Input(run, run.args.rank, tags[k], i, t));
    CudaCheck(run, "copy in",
              cudaMemcpy(bufs[k]->data(), host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  for (int k = 0; k < 2; ++k) {
    commd::CollectiveOptions o;
    o.cuda_stream = streams[k];
    run.Check("two-stream all-reduce", run.g.AllReduce(*bufs[k], n, t, ReduceOp::kSum, o));
  }
  for (int k = 0; k < 2; ++k) {
    CudaCheck(run, "sync", cudaStreamSynchronize(streams[k]));
    std::vector<unsigned char> host(n * Size(t));
    CudaCheck(run, "copy out",
              cudaMemcpy(host.data(), bufs[k]->data(), host.size(), cudaMemcpyDeviceToHost));
    ExpectReduced(run, k == 0 ? "stream 0" : "stream 1", host.data(), tags[k], 0, n, t,
                  ReduceOp::kSum);
    cudaStreamDestroy(streams[k]);
  }
}

// Rank 1's kernel waits at a barrier rank 0 never reaches; commctl abort must end it (the
// device wait reads the abort word) and the group's next call says ABORTED.
void CudaAbortMidKernel(Run& run) {
  if (run.args.rank != 1) return;
  CudaCheck(run, "set device", cudaSetDevice(GpuOfRank(1)));
  cudaStream_t stream;
  CudaCheck(run, "stream", cudaStreamCreate(&stream));
  commd::CollectiveOptions o;
  o.cuda_stream = stream;
  run.Check("enqueue", run.g.AllReduce(run.in, 64, DataType::kFloat32, ReduceOp::kSum, o));
  std::printf("ENTERING\n");
  std::fflush(stdout);
  CudaCheck(run, "kernel ends after the abort", cudaStreamSynchronize(stream));
  const absl::Status s = run.g.AllReduce(run.in, 64, DataType::kFloat32, ReduceOp::kSum, o);
  if (s.code() != absl::StatusCode::kAborted) run.Fail("after abort: " + s.ToString());
  std::printf("rank %d: %s\n", run.args.rank, s.ToString().c_str());
  cudaStreamDestroy(stream);
}

// Mean time of `iters` calls of `call` on `stream`, after 10 unmeasured ones (cuda events).
template <typename Call>
double TimeOnStream(Run& run, cudaStream_t stream, int iters, Call call) {
  for (int i = 0; i < 10; ++i) run.Check("warm-up", call());
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  run.Check("barrier", run.g.Barrier());
  cudaEventRecord(start, stream);
  for (int i = 0; i < iters; ++i) run.Check("timed call", call());
  cudaEventRecord(stop, stream);
  CudaCheck(run, "bench sync", cudaEventSynchronize(stop));
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1e3 / iters;  // microseconds
}

// The figures docs/gpu-testing.md lists: one-shot 8 KiB all-reduce latency and 64 MiB
// all-reduce bus bandwidth (nccl-tests' busbw: 2 (n-1)/n x bytes / time), fp32 sum, printed
// by rank 0 as "BENCH commd <what> <value>" (never asserted).
void CudaBench(Run& run) {
  CudaCheck(run, "set device", cudaSetDevice(GpuOfRank(run.args.rank)));
  cudaStream_t stream;
  CudaCheck(run, "stream", cudaStreamCreate(&stream));
  commd::CollectiveOptions o;
  o.cuda_stream = stream;
  o.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  const double w = run.args.world;
  const size_t small = 8 << 10, large = size_t{64} << 20;
  const double small_us = TimeOnStream(run, stream, 1000, [&] {
    return run.g.AllReduce(run.in, small / 4, DataType::kFloat32, ReduceOp::kSum, o);
  });
  const double large_us = TimeOnStream(run, stream, 20, [&] {
    return run.g.AllReduce(run.in, large / 4, DataType::kFloat32, ReduceOp::kSum, o);
  });
  if (run.args.rank == 0) {
    std::printf("BENCH commd allreduce_8KiB_latency_us %.2f\n", small_us);
    std::printf("BENCH commd allreduce_64MiB_busbw_GBps %.1f\n",
                2 * (w - 1) / w * static_cast<double>(large) / (large_us * 1e3));
  }
  cudaStreamDestroy(stream);
}
#else
void Cuda(Run& run) { run.Fail("mode cuda needs a build with CUDA"); }
void CudaRemapped(Run& run) { Cuda(run); }
void CudaTwoStreams(Run& run) { Cuda(run); }
void CudaAbortMidKernel(Run& run) { Cuda(run); }
void CudaBench(Run& run) { Cuda(run); }
#endif

// ---- Group options of the modes that set their own. ----

void SampleEveryThird(commd::GroupOptions& o) {
  o.nan_check = commd::GroupOptions::NanCheck::kSampled;
  o.nan_sample_period = 3;
}
void CheckOnPolicyFail(commd::GroupOptions& o) {
  o.nan_check = commd::GroupOptions::NanCheck::kOn;
  o.nan_policy = commd::GroupOptions::NanPolicy::kFail;
}
void CheckOffPolicyFail(commd::GroupOptions& o) {
  o.nan_check = commd::GroupOptions::NanCheck::kOff;
  o.nan_policy = commd::GroupOptions::NanPolicy::kFail;
}
void OwnGpu(commd::GroupOptions& o) { o.device = commd::Device::Cuda(GpuOfRank(o.rank)); }
// Before anything loads the driver: this process sees only its rank's GPU, as its cuda:0.
void RemappedGpu(commd::GroupOptions& o) {
  ::setenv("CUDA_VISIBLE_DEVICES", std::to_string(GpuOfRank(o.rank)).c_str(), 1);
  o.device = commd::Device::Cuda(0);
}

struct Mode {
  const char* name;
  void (*run)(Run&);
  void (*group_options)(commd::GroupOptions&) = nullptr;  // beyond group "c" on the host
  size_t max_count = 4099;  // elements of 8 bytes per rank in each buffer
};

const Mode kModes[] = {
    {"matrix", Matrix},
    {"large", Large, nullptr, size_t{1} << 20},
    {"repeat", Repeat},
    {"invalid", Invalid},
    {"nan", Nan},
    {"nan_group", NanGroupDefault},
    {"nan_sampled3", NanSampled, SampleEveryThird},
    {"nan_fail", NanFail, CheckOnPolicyFail},
    {"nan_off_fail", NanOffFail, CheckOffPolicyFail},
    {"mismatch", Mismatch},
    {"abort", AbortWhileWaiting},
    {"cuda", Cuda, OwnGpu},
    {"cuda_remapped", CudaRemapped, RemappedGpu},
    {"cuda_streams", CudaTwoStreams, OwnGpu},
    {"cuda_abort", CudaAbortMidKernel, OwnGpu},
    {"cuda_bench", CudaBench, OwnGpu, size_t{8} << 20},  // 64 MiB of fp32 per rank and more
    {"host_matrix", HostMatrix},
    {"host_large", HostLarge, nullptr, size_t{1} << 20},
    {"host_overlapping", HostOverlapping},
    {"host_invalid", HostInvalid},
    {"host_nan_fail", HostNanFail, CheckOnPolicyFail},
    {"matmul", FusedMatmul, nullptr, size_t{1} << 16},
    {"matmul_invalid", FusedMatmulInvalid},
    {"matmul_nan_fail", FusedMatmulNanFail, CheckOnPolicyFail},
    {"matmul_missing_rank", FusedMatmulMissingRank},
    {"cuda_matmul", CudaFusedMatmul, OwnGpu, size_t{1} << 16},
    {"part_of", PartOf},
    {"part_of_nan_fail", PartOfNanFail, CheckOnPolicyFail},
};

const Mode* FindMode(const std::string& name) {
  for (const Mode& m : kModes) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

// Waits (up to 3 minutes) for $COLLECTIVE_RANK_HOLD to exist, when set.
void Hold(int rank) {
  const char* path = std::getenv("COLLECTIVE_RANK_HOLD");
  if (path == nullptr) return;
  std::printf("rank %d: HOLDING\n", rank);
  std::fflush(stdout);
  for (int i = 0; i < 3600 && access(path, F_OK) != 0; ++i) usleep(50000);
}

// Connects, joins group "c" with the mode's options, allocates the two buffers and runs the
// mode: the process's exit code.
int RunMode(const Args& args, const Mode& mode) {
  auto client = commd::Client::Connect({.job_id = "job"});
  if (!client.ok()) {
    std::printf("connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  commd::GroupOptions options{
      .name = "c", .rank = args.rank, .world_size = args.world, .timeout = absl::Minutes(2)};
  if (mode.group_options != nullptr) mode.group_options(options);
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) {
    std::printf("join: %s\n", group.status().ToString().c_str());
    return 1;
  }
  auto in = (*group)->AllocateSymmetric(mode.max_count * 8 * args.world);
  auto out = (*group)->AllocateSymmetric(mode.max_count * 8 * args.world);
  if (!in.ok() || !out.ok()) {
    std::printf("allocate: %s %s\n", in.status().ToString().c_str(),
                out.status().ToString().c_str());
    return 1;
  }
  Run run{.args = args, .client = **client, .g = **group, .in = **in, .out = **out};
  mode.run(run);
  Hold(args.rank);
  if (run.failures > 0) return 1;
  std::printf("OK %s\n", args.mode.c_str());
  return 0;
}

}  // namespace collective_rank

int main(int argc, char** argv) {
  using collective_rank::Args;
  using collective_rank::Mode;
  if (argc != 5) {
    std::fprintf(stderr, "usage: collective_rank <rank> <world> <seed> <mode>\n");
    return 2;
  }
  Args args{.rank = std::atoi(argv[1]),
            .world = std::atoi(argv[2]),
            .seed = std::strtoull(argv[3], nullptr, 10),
            .mode = argv[4]};
  const size_t colon = args.mode.find(':');
  args.name = args.mode.substr(0, colon);
  if (colon != std::string::npos) args.argument = args.mode.substr(colon + 1);
  const Mode* mode = collective_rank::FindMode(args.name);
  if (mode == nullptr) {
    std::printf("unknown mode %s\n", args.mode.c_str());
    return 2;
  }
  return collective_rank::RunMode(args, *mode);
}
