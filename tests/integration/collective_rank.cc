// One rank of collective_test: joins group "c" of the daemon in $COMMD_RUNTIME_DIR and runs
// a mode's collectives through the SDK, checking every output against a float64 reference
// computed from every rank's inputs (regenerated here from the shared seed).
//
//   collective_rank <rank> <world> <seed> <mode>
//   mode: matrix | large | repeat[:N] | invalid | nan | nan_group | nan_sampled3 | nan_fail |
//         nan_off_fail | mismatch | abort | cuda
// (cuda: rank r on Device::Cuda(r), stream-ordered collectives; needs a CUDA build and a GPU
// per rank.)
// Prints "OK <mode>" and exits 0, or prints each mismatch and exits 1. With
// $COLLECTIVE_RANK_HOLD set, a rank prints "HOLDING" once done and waits for that file to
// exist before it leaves the group (so the daemon can still read its control block).
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

namespace {

using commd::DataType;
using commd::ReduceOp;
namespace k = commd::kernels;

int g_rank = 0, g_world = 0;
uint64_t g_seed = 0;
int g_failures = 0;

void Fail(const std::string& what) {
  if (++g_failures <= 20) std::printf("rank %d: FAIL %s\n", g_rank, what.c_str());
}

size_t Size(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 ? 2 : t == DataType::kInt64 ? 8 : 4;
}

// Input value i of rank r for test `tag`: nonzero; exactly representable in the type.
double Input(int r, uint64_t tag, size_t i, DataType t) {
  std::mt19937_64 g(g_seed ^ (tag * 0x9E3779B97F4A7C15ull) ^ (uint64_t(r) << 48) ^ i);
  const uint64_t v = g();
  const int64_t m = static_cast<int64_t>(v % 32) - 16;
  const int64_t nz = m >= 0 ? m + 1 : m;  // -16..-1, 1..16
  switch (t) {
    case DataType::kFloat32:
      return static_cast<float>((static_cast<double>(v >> 11) / 9007199254740992.0 + 0.01) *
                                (nz > 0 ? 1 : -1));
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return nz / 4.0;
    case DataType::kInt32:
      return static_cast<double>(static_cast<int32_t>((v >> 8) % 2000001) - 1000000 | 1);
    case DataType::kInt64:
      return static_cast<double>(static_cast<int64_t>((v >> 8) % 2000000001) - 1000000000 | 1);
  }
  return 0;
}

void Store(void* p, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat16:
      static_cast<k::Half*>(p)[i] = k::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<k::BFloat16*>(p)[i] = k::FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
  }
}

double Load(const void* p, size_t i, DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat16:
      return k::HalfToFloat(static_cast<const k::Half*>(p)[i]);
    case DataType::kBFloat16:
      return k::BFloat16ToFloat(static_cast<const k::BFloat16*>(p)[i]);
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

// Reference of element i over every rank's input; `abs_sum` for the float error bound.
double Reference(uint64_t tag, size_t i, DataType t, ReduceOp op, double* abs_sum) {
  double acc = 0;
  *abs_sum = 0;
  for (int r = 0; r < g_world; ++r) {
    const double x = Input(r, tag, i, t);
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
    acc /= g_world;
    if (t == DataType::kInt32 || t == DataType::kInt64) acc = std::trunc(acc);
  }
  return acc;
}

bool Close(double got, double want, double abs_sum, DataType t, ReduceOp op) {
  if (t == DataType::kInt32 || t == DataType::kInt64) return got == want;
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) return got == want;
  // Any summation order: |error| <= (n - 1) * u * sum|x| plus the final rounding.
  const double u = t == DataType::kFloat32 ? 0x1p-24 : t == DataType::kFloat16 ? 0x1p-11 : 0x1p-8;
  return std::fabs(got - want) <= (g_world + 1) * u * abs_sum + u * std::fabs(want) + 1e-30;
}

void Poison(void* p, size_t bytes) { std::memset(p, 0xA5, bytes); }

void Check(const char* what, absl::Status s) {
  if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
}

uint64_t g_tag = 0;

void AllReduceOne(commd::Group& g, commd::SymmetricBuffer& buf, size_t n, DataType t, ReduceOp op) {
  const uint64_t tag = ++g_tag;
  Poison(buf.data(), buf.size());
  for (size_t i = 0; i < n; ++i) Store(buf.data(), i, t, Input(g_rank, tag, i, t));
  Check("all-reduce", g.AllReduce(buf, n, t, op));
  for (size_t i = 0; i < n; ++i) {
    double abs_sum;
    const double want = Reference(tag, i, t, op, &abs_sum);
    const double got = Load(buf.data(), i, t);
    if (!Close(got, want, abs_sum, t, op)) {
      Fail("all-reduce type " + std::to_string(int(t)) + " op " + std::to_string(int(op)) + " n " +
           std::to_string(n) + " [" + std::to_string(i) + "] " + std::to_string(got) + " want " +
           std::to_string(want));
      return;
    }
  }
}

void AllGatherOne(commd::Group& g, commd::SymmetricBuffer& in, commd::SymmetricBuffer& out,
                  size_t n, DataType t) {
  const uint64_t tag = ++g_tag;
  Poison(out.data(), out.size());
  for (size_t i = 0; i < n; ++i) Store(in.data(), i, t, Input(g_rank, tag, i, t));
  Check("all-gather", g.AllGather(in, out, n, t));
  for (int r = 0; r < g_world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      double want = Input(r, tag, i, t);
      if (t == DataType::kFloat32) want = static_cast<float>(want);
      if (Load(out.data(), r * n + i, t) != want) {
        Fail("all-gather type " + std::to_string(int(t)) + " n " + std::to_string(n) + " rank " +
             std::to_string(r) + " [" + std::to_string(i) + "]");
        return;
      }
    }
  }
}

void ReduceScatterOne(commd::Group& g, commd::SymmetricBuffer& in, commd::SymmetricBuffer& out,
                      size_t n, DataType t, ReduceOp op) {
  const uint64_t tag = ++g_tag;
  Poison(out.data(), out.size());
  for (size_t i = 0; i < n * g_world; ++i) Store(in.data(), i, t, Input(g_rank, tag, i, t));
  Check("reduce-scatter", g.ReduceScatter(in, out, n, t, op));
  for (size_t i = 0; i < n; ++i) {
    double abs_sum;
    const double want = Reference(tag, g_rank * n + i, t, op, &abs_sum);
    const double got = Load(out.data(), i, t);
    if (!Close(got, want, abs_sum, t, op)) {
      Fail("reduce-scatter type " + std::to_string(int(t)) + " op " + std::to_string(int(op)) +
           " n " + std::to_string(n) + " [" + std::to_string(i) + "] " + std::to_string(got) +
           " want " + std::to_string(want));
      return;
    }
  }
}

// NaN at [7] and Inf at [8] of rank 1's 64 floats when `plant`; every other value 1.
void PlantNan(commd::SymmetricBuffer& buf, bool plant) {
  auto* p = static_cast<float*>(buf.data());
  for (int i = 0; i < 64; ++i) p[i] = 1.0f;
  if (plant && g_rank == 1) {
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
NanRun RunNan(commd::Group& g, commd::SymmetricBuffer& buf, bool plant,
              commd::CollectiveOptions o = {}) {
  PlantNan(buf, plant);
  NanRun r;
  o.nonfinite_count = &r.here;
  o.nonfinite_ranks = &r.ranks;
  r.status = g.AllReduce(buf, 64, DataType::kFloat32, ReduceOp::kSum, o);
  return r;
}

// The group's default check from the daemon's config (on): 5 collectives with NaN on rank 1,
// then 3 clean ones; every rank sees rank 1's finding.
void NanGroupDefault(commd::Group& g, commd::SymmetricBuffer& buf) {
  for (int i = 0; i < 8; ++i) {
    const NanRun r = RunNan(g, buf, i < 5);
    Check("nan_group", r.status);
    const uint64_t here = i < 5 && g_rank == 1 ? 2 : 0;
    if (r.here != here || r.ranks != (i < 5 ? 1 : 0))
      Fail("nan_group " + std::to_string(i) + ": here " + std::to_string(r.here) + " ranks " +
           std::to_string(r.ranks));
  }
}

// The group samples every 3rd collective (GroupOptions): 10 of 30 consecutive ones check, on
// every rank alike.
void NanSampled(commd::Group& g, commd::SymmetricBuffer& buf) {
  int hits = 0;
  for (int i = 0; i < 30; ++i) {
    const NanRun r = RunNan(g, buf, true);
    Check("nan_sampled3", r.status);
    hits += r.ranks != 0;
  }
  if (hits != 10) Fail("sampled(3): " + std::to_string(hits) + " checks found NaN of 30");
}

// Policy FAIL (GroupOptions): DATA_LOSS on every rank naming rank 1; the buffer stays usable;
// a call that opts out of the check is not failed.
void NanFail(commd::Group& g, commd::SymmetricBuffer& buf) {
  const NanRun r = RunNan(g, buf, true);
  if (r.status.code() != absl::StatusCode::kDataLoss ||
      r.status.message().find("first rank 1") == absl::string_view::npos ||
      r.status.message().find("all_reduce seq 1") == absl::string_view::npos)
    Fail("nan_fail: " + r.status.ToString());
  else
    std::printf("rank %d: %s\n", g_rank, r.status.ToString().c_str());
  const NanRun clean = RunNan(g, buf, false);
  Check("nan_fail clean", clean.status);
  if (static_cast<float*>(buf.data())[7] != static_cast<float>(g_world)) Fail("nan_fail sum");
  commd::CollectiveOptions off;
  off.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  Check("nan_fail opted out", RunNan(g, buf, true, off).status);
}

// Check off and policy FAIL (GroupOptions): NaN goes through unnoticed.
void NanOffFail(commd::Group& g, commd::SymmetricBuffer& buf) {
  for (int i = 0; i < 5; ++i) {
    const NanRun r = RunNan(g, buf, true);
    Check("nan_off_fail", r.status);
    if (r.here != 0 || r.ranks != 0) Fail("nan_off_fail found NaN with the check off");
  }
}

// Seq 1 agrees; seq 2: rank 0 reduces 100 floats, rank 1 200. Both must fail, naming both.
void Mismatch(commd::Group& g, commd::SymmetricBuffer& buf) {
  Check("mismatch seq 1", RunNan(g, buf, false).status);
  const absl::Status s =
      g.AllReduce(buf, g_rank == 1 ? 200 : 100, DataType::kFloat32, ReduceOp::kSum);
  if (s.code() != absl::StatusCode::kInvalidArgument ||
      s.message().find("rank 0 has 100 x float32") == absl::string_view::npos ||
      s.message().find("rank 1 has 200 x float32") == absl::string_view::npos)
    Fail("mismatch: " + s.ToString());
  else
    std::printf("rank %d: MISMATCHED %s\n", g_rank, s.ToString().c_str());
}

// Rank 1 enters an all-reduce that rank 0 never joins; the test aborts the group.
void AbortWhileWaiting(commd::Group& g, commd::SymmetricBuffer& buf) {
  if (g_rank != 1) return;
  std::printf("ENTERING\n");
  std::fflush(stdout);
  const absl::Status s = g.AllReduce(buf, 64, DataType::kFloat32, ReduceOp::kSum);
  if (s.code() != absl::StatusCode::kAborted ||
      s.message().find("stop the collective test") == absl::string_view::npos)
    Fail("abort: " + s.ToString());
  else
    std::printf("rank %d: %s\n", g_rank, s.ToString().c_str());
}

#ifdef COMMD_HAVE_CUDA
void CudaCheck(const char* what, cudaError_t e) {
  if (e != cudaSuccess) Fail(std::string(what) + ": " + cudaGetErrorString(e));
}

// Fills `n` inputs of `tag` into device buffer `dev`, runs `call` on `stream`, waits and
// copies `out_n` elements of `out` back.
template <typename Call>
std::vector<unsigned char> OnDevice(cudaStream_t stream, uint64_t tag, void* dev, size_t n,
                                    DataType t, void* out, size_t out_n, Call call) {
  std::vector<unsigned char> host(std::max(n, out_n) * Size(t));
  for (size_t i = 0; i < n; ++i) Store(host.data(), i, t, Input(g_rank, tag, i, t));
  CudaCheck("copy in",
            cudaMemcpyAsync(dev, host.data(), n * Size(t), cudaMemcpyHostToDevice, stream));
  Check("cuda collective", call());
  CudaCheck("copy out",
            cudaMemcpyAsync(host.data(), out, out_n * Size(t), cudaMemcpyDeviceToHost, stream));
  CudaCheck("sync", cudaStreamSynchronize(stream));
  return host;
}

void ExpectReduced(const char* what, const std::vector<unsigned char>& got, uint64_t tag,
                   size_t first, size_t n, DataType t, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    double abs_sum;
    const double want = Reference(tag, first + i, t, op, &abs_sum);
    if (!Close(Load(got.data(), i, t), want, abs_sum, t, op)) {
      Fail(std::string(what) + " [" + std::to_string(i) + "] " +
           std::to_string(Load(got.data(), i, t)) + " want " + std::to_string(want));
      return;
    }
  }
}

// All-reduce one-shot (7) and two-shot (4099), all-gather, reduce-scatter and barrier on
// this rank's GPU, on a stream of its own; then NaN counted on the device reaches the
// control block once the next call finds the first complete.
void CudaMode(commd::Group& g, commd::SymmetricBuffer& in, commd::SymmetricBuffer& out) {
  CudaCheck("set device", cudaSetDevice(g_rank));
  cudaStream_t stream;
  CudaCheck("stream", cudaStreamCreate(&stream));
  commd::CollectiveOptions o;
  o.cuda_stream = stream;
  for (size_t n : {size_t{7}, size_t{4099}}) {
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      const uint64_t tag = ++g_tag;
      auto got = OnDevice(stream, tag, in.data(), n, t, in.data(), n,
                          [&] { return g.AllReduce(in, n, t, ReduceOp::kSum, o); });
      ExpectReduced("cuda all-reduce", got, tag, 0, n, t, ReduceOp::kSum);
    }
  }
  const size_t n = 1025;
  uint64_t tag = ++g_tag;
  auto got = OnDevice(stream, tag, in.data(), n * g_world, DataType::kFloat32, out.data(), n, [&] {
    return g.ReduceScatter(in, out, n, DataType::kFloat32, ReduceOp::kMax, o);
  });
  ExpectReduced("cuda reduce-scatter", got, tag, g_rank * n, n, DataType::kFloat32, ReduceOp::kMax);
  tag = ++g_tag;
  got = OnDevice(stream, tag, in.data(), n, DataType::kInt32, out.data(), n * g_world,
                 [&] { return g.AllGather(in, out, n, DataType::kInt32, o); });
  for (int r = 0; r < g_world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (Load(got.data(), r * n + i, DataType::kInt32) != Input(r, tag, i, DataType::kInt32)) {
        Fail("cuda all-gather rank " + std::to_string(r) + " [" + std::to_string(i) + "]");
        r = g_world;
        break;
      }
    }
  }
  Check("cuda barrier", g.Barrier());
  CudaCheck("barrier sync", cudaDeviceSynchronize());
  // NaN on rank 1, counted on the device: the next call retires it into the nan counters.
  uint64_t count = 0;
  o.nonfinite_count = &count;
  if (g.AllReduce(in, 1, DataType::kFloat32, ReduceOp::kSum, o).code() !=
      absl::StatusCode::kInvalidArgument)
    Fail("nonfinite_count on CUDA buffers was accepted");
  o.nonfinite_count = nullptr;
  o.nan_check = commd::CollectiveOptions::NanCheck::kOn;
  std::vector<float> nan(64, 1.0f);
  if (g_rank == 1) nan[3] = NAN;
  CudaCheck("nan in", cudaMemcpy(in.data(), nan.data(), 64 * 4, cudaMemcpyHostToDevice));
  Check("cuda nan all-reduce", g.AllReduce(in, 64, DataType::kFloat32, ReduceOp::kSum, o));
  CudaCheck("nan sync", cudaStreamSynchronize(stream));
  Check("cuda barrier after nan", g.Barrier());
  const auto* counters = reinterpret_cast<const commd::ControlBlockCounters*>(
      static_cast<const char*>(g.control_block()) + commd::kCountersOffset);
  if (counters->nan_checks != 1 || counters->nans_found != (g_rank == 1 ? 1u : 0u))
    Fail("cuda nan counters: checks " + std::to_string(counters->nan_checks) + " found " +
         std::to_string(counters->nans_found));
  CudaCheck("final sync", cudaDeviceSynchronize());
  cudaStreamDestroy(stream);
}
#endif

// Waits (up to 3 minutes) for $COLLECTIVE_RANK_HOLD to exist, when set.
void Hold() {
  const char* path = std::getenv("COLLECTIVE_RANK_HOLD");
  if (path == nullptr) return;
  std::printf("rank %d: HOLDING\n", g_rank);
  std::fflush(stdout);
  for (int i = 0; i < 3600 && access(path, F_OK) != 0; ++i) usleep(50000);
}

commd::GroupOptions OptionsFor(const std::string& mode) {
  commd::GroupOptions o{
      .name = "c", .rank = g_rank, .world_size = g_world, .timeout = absl::Minutes(2)};
  using G = commd::GroupOptions;
  if (mode == "nan_sampled3") {
    o.nan_check = G::NanCheck::kSampled;
    o.nan_sample_period = 3;
  } else if (mode == "nan_fail") {
    o.nan_check = G::NanCheck::kOn;
    o.nan_policy = G::NanPolicy::kFail;
  } else if (mode == "nan_off_fail") {
    o.nan_check = G::NanCheck::kOff;
    o.nan_policy = G::NanPolicy::kFail;
  } else if (mode == "cuda") {
    o.device = commd::Device::Cuda(g_rank);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: collective_rank <rank> <world> <seed> <mode>\n");
    return 2;
  }
  g_rank = std::atoi(argv[1]);
  g_world = std::atoi(argv[2]);
  g_seed = std::strtoull(argv[3], nullptr, 10);
  const std::string mode = argv[4];
  auto client = commd::Client::Connect({.job_id = "job"});
  if (!client.ok()) {
    std::printf("connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto group = (*client)->JoinGroup(OptionsFor(mode));
  if (!group.ok()) {
    std::printf("join: %s\n", group.status().ToString().c_str());
    return 1;
  }
  commd::Group& g = **group;
  const size_t max_count = mode == "large" ? (size_t{1} << 20) : 4099;
  auto in = g.AllocateSymmetric(max_count * 8 * g_world);
  auto out = g.AllocateSymmetric(max_count * 8 * g_world);
  if (!in.ok() || !out.ok()) {
    std::printf("allocate: %s %s\n", in.status().ToString().c_str(),
                out.status().ToString().c_str());
    return 1;
  }
  const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                            DataType::kInt32, DataType::kInt64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};
  if (mode == "matrix") {
    // 1 element, odd, not divisible by the world size, 4 KiB of fp32.
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{1024}}) {
      for (DataType t : types) {
        for (ReduceOp op : ops) {
          AllReduceOne(g, **in, n, t, op);
          ReduceScatterOne(g, **in, **out, n, t, op);
        }
        AllGatherOne(g, **in, **out, n, t);
      }
    }
    Check("barrier", g.Barrier());
    // Coalesced: three tensors of different types, one collective.
    const uint64_t tag = ++g_tag;
    std::vector<commd::CoalescedTensor> ts = {
        {0, 5, DataType::kFloat32}, {64, 3, DataType::kInt64}, {128, 9, DataType::kInt32}};
    Poison((*in)->data(), (*in)->size());
    for (const auto& t : ts) {
      for (size_t i = 0; i < t.count; ++i)
        Store(static_cast<char*>((*in)->data()) + t.offset, i, t.dtype,
              Input(g_rank, tag + t.offset, i, t.dtype));
    }
    Check("coalesced", g.AllReduceCoalesced(**in, ts, ReduceOp::kSum));
    for (const auto& t : ts) {
      for (size_t i = 0; i < t.count; ++i) {
        double abs_sum;
        const double want = Reference(tag + t.offset, i, t.dtype, ReduceOp::kSum, &abs_sum);
        const double got = Load(static_cast<char*>((*in)->data()) + t.offset, i, t.dtype);
        if (!Close(got, want, abs_sum, t.dtype, ReduceOp::kSum)) Fail("coalesced");
      }
    }
  } else if (mode == "large") {
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      AllReduceOne(g, **in, (size_t{1} << 20) / Size(t), t, ReduceOp::kSum);
    }
    ReduceScatterOne(g, **in, **out, (size_t{1} << 18) + 1, DataType::kFloat32, ReduceOp::kSum);
    AllGatherOne(g, **in, **out, (size_t{1} << 18) + 1, DataType::kInt32);
  } else if (mode.rfind("repeat", 0) == 0) {
    const int iterations = mode.size() > 7 ? std::atoi(mode.c_str() + 7) : 10000;
    for (int it = 0; it < iterations && g_failures == 0; ++it) {
      auto* p = static_cast<int32_t*>((*in)->data());
      for (int i = 0; i < 4; ++i) p[i] = g_rank * 1000 + it + i;
      Check("repeat", g.AllReduce(**in, 4, DataType::kInt32, ReduceOp::kSum));
      for (int i = 0; i < 4; ++i) {
        const int32_t want = 1000 * g_world * (g_world - 1) / 2 + g_world * (it + i);
        if (p[i] != want) Fail("repeat " + std::to_string(it));
      }
    }
  } else if (mode == "invalid") {
    auto expect_invalid = [&](const char* what, absl::Status s, const char* needle) {
      if (s.code() != absl::StatusCode::kInvalidArgument ||
          s.message().find(needle) == absl::string_view::npos)
        Fail(std::string(what) + ": " + s.ToString());
      else
        std::printf("rank %d: %s -> %s\n", g_rank, what, s.ToString().c_str());
    };
    std::memset((*in)->data(), 7, 16);
    const size_t too_many = (*in)->size() / 4 + 1;
    expect_invalid("count too large", g.AllReduce(**in, too_many, DataType::kInt32, ReduceOp::kSum),
                   "at most");
    expect_invalid("bad dtype", g.AllReduce(**in, 1, static_cast<DataType>(9), ReduceOp::kSum),
                   "[0, 4]");
    expect_invalid("bad op", g.AllReduce(**in, 1, DataType::kInt32, static_cast<ReduceOp>(7)),
                   "[0, 3]");
    expect_invalid("same buffer", g.AllGather(**in, **in, 1, DataType::kInt32), "same buffer");
    expect_invalid("out too small",
                   g.AllGather(**in, **out, (*out)->size() / 4 / g_world + 1, DataType::kInt32),
                   "at most");
    commd::CollectiveOptions o;
    o.nan_check = commd::CollectiveOptions::NanCheck::kSampled;
    o.nan_sample_period = 0;
    expect_invalid("sample period", g.AllReduce(**in, 1, DataType::kInt32, ReduceOp::kSum, o),
                   "[1, 1000000]");
    if (static_cast<unsigned char*>((*in)->data())[0] != 7) Fail("invalid call touched the buffer");
    // Group NaN settings the daemon rejects, naming the value and the allowed ones.
    commd::GroupOptions bad{.name = "bad", .rank = g_rank, .world_size = g_world};
    bad.nan_sample_period = 2000000;
    expect_invalid("group sample period", (*client)->JoinGroup(bad).status(), "1 to 1000000");
    bad.nan_sample_period = 0;
    bad.nan_check = static_cast<commd::GroupOptions::NanCheck>(9);
    expect_invalid("group nan check", (*client)->JoinGroup(bad).status(), "nan check 9");
    bad.nan_check = commd::GroupOptions::NanCheck::kDefault;
    bad.nan_policy = static_cast<commd::GroupOptions::NanPolicy>(5);
    expect_invalid("group nan policy", (*client)->JoinGroup(bad).status(), "2 (fail)");
    // A buffer of another group.
    auto other = (*client)->JoinGroup({.name = "other", .rank = g_rank, .world_size = g_world});
    if (!other.ok()) {
      Fail("join other: " + other.status().ToString());
    } else {
      auto ob = (*other)->AllocateSymmetric(64);
      if (!ob.ok())
        Fail("alloc other");
      else
        expect_invalid("foreign buffer", g.AllReduce(**ob, 1, DataType::kInt32, ReduceOp::kSum),
                       "not allocated by this group");
    }
  } else if (mode == "nan") {
    auto* p = static_cast<float*>((*in)->data());
    auto run = [&](commd::CollectiveOptions o) {
      for (int i = 0; i < 64; ++i) p[i] = 1.0f;
      if (g_rank == 0) p[5] = NAN;
      uint64_t found = 99;
      o.nonfinite_count = &found;
      Check("nan", g.AllReduce(**in, 64, DataType::kFloat32, ReduceOp::kSum, o));
      return found;
    };
    commd::CollectiveOptions on, off, sampled;
    on.nan_check = commd::CollectiveOptions::NanCheck::kOn;
    sampled.nan_check = commd::CollectiveOptions::NanCheck::kSampled;
    sampled.nan_sample_period = 4;
    const uint64_t want = g_rank == 0 ? 1 : 0;
    if (run(on) != want) Fail("nan on");
    if (run(off) != 0) Fail("nan off");
    int hits = 0;
    for (int i = 0; i < 40; ++i) hits += run(sampled) != 0;
    if (g_rank == 0 && hits != 10) Fail("sampled(4): " + std::to_string(hits) + " hits of 40");
    if (g_rank != 0 && hits != 0) Fail("sampled on a clean rank");
  } else if (mode == "nan_group") {
    NanGroupDefault(g, **in);
  } else if (mode == "nan_sampled3") {
    NanSampled(g, **in);
  } else if (mode == "nan_fail") {
    NanFail(g, **in);
  } else if (mode == "nan_off_fail") {
    NanOffFail(g, **in);
  } else if (mode == "mismatch") {
    Mismatch(g, **in);
  } else if (mode == "abort") {
    AbortWhileWaiting(g, **in);
  } else if (mode == "cuda") {
#ifdef COMMD_HAVE_CUDA
    CudaMode(g, **in, **out);
#else
    Fail("mode cuda needs a build with CUDA");
#endif
  } else {
    std::printf("unknown mode %s\n", mode.c_str());
    return 2;
  }
  Hold();
  if (g_failures > 0) return 1;
  std::printf("OK %s\n", mode.c_str());
  return 0;
}
