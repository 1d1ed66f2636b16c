// The fused matmuls against their unfused forms, through the SDK on a real commd, in one run
// with the variants interleaved round by round (the machine is shared: each variant's best
// and median round are printed):
//   all-gather + matmul   fused: Group::AllGatherMatmul (no gathered copy of A)
//                         unfused: Group::AllGather into a gathered buffer, then the same sgemm
//   matmul + reduce-scatter  fused: Group::MatmulReduceScatter (partials written into the
//                         destinations' workspace by sgemm)
//                         unfused: sgemm into a symmetric buffer, then Group::ReduceScatter
// Shapes: a tensor-parallel MLP scaled to the machine: A is (world x rows) x k gathered, B is
// k x n. Memory: the bytes each variant holds beyond its operands and outputs.
//
//   build/bench/fused_matmul_bench [--ranks N] [--rows R] [--k K] [--n N] [--rounds N]
//   Each rank runs one BLAS thread (openblas_set_num_threads(1)), as a trainer with a rank per
//   core does: the ranks already use every core.
#include <cblas.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "bench/rank_processes.h"
#include "commd/commd.h"
#include "tests/integration/daemon_process.h"

namespace {

struct Shape {
  int ranks = 2;
  size_t rows = 1024;  // A rows per rank
  size_t k = 1024;
  size_t n = 1024;
  int rounds = 7;
};

enum Variant { kFusedAg, kUnfusedAg, kFusedRs, kUnfusedRs, kVariants };
const char* kNames[kVariants] = {"all-gather+matmul fused", "all-gather+matmul unfused",
                                 "matmul+reduce-scatter fused", "matmul+reduce-scatter unfused"};

double NowUs() { return absl::ToDoubleMicroseconds(absl::Now() - absl::UnixEpoch()); }

void Gemm(const float* a, size_t m, size_t k, const float* b, size_t n, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(n), 0.0f, c,
              static_cast<int>(n));
}

#define CHECK_OK(expr)                                                      \
  do {                                                                      \
    const absl::Status s_ = (expr);                                         \
    if (!s_.ok()) {                                                         \
      std::fprintf(stderr, "rank: %s: %s\n", #expr, s_.ToString().c_str()); \
      ::_exit(4);                                                           \
    }                                                                       \
  } while (0)

// One rank: every round runs each variant once (a barrier first), rank 0's times recorded.
void RunRank(const std::string& dir, int rank, const Shape& s, double* times) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  openblas_set_num_threads(1);
  auto client = commd::Client::Connect({.runtime_dir = dir, .job_id = "bench"});
  if (!client.ok()) ::_exit(1);
  auto group = (*client)->JoinGroup({.name = "tp", .rank = rank, .world_size = s.ranks});
  if (!group.ok()) ::_exit(2);
  commd::Group& g = **group;
  const size_t w = static_cast<size_t>(s.ranks), grows = w * s.rows;
  auto shard = g.AllocateSymmetric(s.rows * s.k * 4);
  auto gathered = g.AllocateSymmetric(grows * s.k * 4);      // unfused all-gather only
  auto workspace = g.AllocateSymmetric(grows * s.n * 4);     // both matmul + reduce-scatter
  auto partial_out = g.AllocateSymmetric(s.rows * s.n * 4);  // unfused reduce-scatter output
  if (!shard.ok() || !gathered.ok() || !workspace.ok() || !partial_out.ok()) ::_exit(3);
  std::vector<float> b(s.k * s.n), out(grows * s.n), a_local(grows * s.k), rs_out(s.rows * s.n);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 7 + rank) % 13) / 13;
  for (size_t i = 0; i < a_local.size(); ++i) a_local[i] = static_cast<float>(i % 11) / 11;
  auto* a_shard = static_cast<float*>((*shard)->data());
  for (size_t i = 0; i < s.rows * s.k; ++i) a_shard[i] = static_cast<float>((i + rank) % 5) / 5;
  const commd::MatmulB ag_b{.data = b.data(), .n = s.n, .out = out.data()};
  const commd::MatmulB rs_b{.data = b.data(), .n = s.n, .out = rs_out.data()};
  for (int round = 0; round < s.rounds + 1; ++round) {  // round 0 warms up
    for (int v = 0; v < kVariants; ++v) {
      CHECK_OK(g.Barrier());
      const double t0 = NowUs();
      switch (v) {
        case kFusedAg:
          CHECK_OK(g.AllGatherMatmul(**shard, s.rows, s.k, commd::DataType::kFloat32, {ag_b}));
          break;
        case kUnfusedAg:
          CHECK_OK(g.AllGather(**shard, **gathered, s.rows * s.k, commd::DataType::kFloat32));
          Gemm(static_cast<const float*>((*gathered)->data()), grows, s.k, b.data(), s.n,
               out.data());
          break;
        case kFusedRs:
          CHECK_OK(g.MatmulReduceScatter(a_local.data(), grows, s.k, commd::DataType::kFloat32,
                                         rs_b, commd::ReduceOp::kSum, **workspace));
          break;
        case kUnfusedRs:
          Gemm(a_local.data(), grows, s.k, b.data(), s.n,
               static_cast<float*>((*workspace)->data()));
          CHECK_OK(g.ReduceScatter(**workspace, **partial_out, s.rows * s.n,
                                   commd::DataType::kFloat32, commd::ReduceOp::kSum));
          break;
      }
      CHECK_OK(g.Barrier());  // the slowest rank's time
      if (rank == 0 && round > 0) times[(round - 1) * kVariants + v] = NowUs() - t0;
    }
  }
  ::_exit(0);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (flag == "--ranks")
      s.ranks = static_cast<int>(v);
    else if (flag == "--rows")
      s.rows = static_cast<size_t>(v);
    else if (flag == "--k")
      s.k = static_cast<size_t>(v);
    else if (flag == "--n")
      s.n = static_cast<size_t>(v);
    else if (flag == "--rounds")
      s.rounds = static_cast<int>(v);
    else {
      std::fprintf(stderr,
                   "usage: fused_matmul_bench [--ranks N] [--rows R] [--k K] [--n N] "
                   "[--rounds N]\n");
      return 2;
    }
  }
  if (s.ranks < 1 || s.rows < 1 || s.k < 1 || s.n < 1 || s.rounds < 1) {
    std::fprintf(stderr, "fused_matmul_bench: every value must be >= 1\n");
    return 2;
  }
  commd::testing::TempDir tmp;
  auto daemon = commd::testing::DaemonProcess::Start(tmp.Join("run"));
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  auto* times =
      static_cast<double*>(::mmap(nullptr, sizeof(double) * s.rounds * kVariants,
                                  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const std::string dir = (*daemon)->runtime_dir();
  if (!commd::bench::RunRankProcesses(s.ranks, [&](int r) { RunRank(dir, r, s, times); })) {
    std::fprintf(stderr, "fused_matmul_bench: a rank failed\n");
    return 1;
  }
  const size_t grows = static_cast<size_t>(s.ranks) * s.rows;
  std::printf("%d ranks, A %zu x %zu (rows %zu per rank), B %zu x %zu, float32, %d rounds\n",
              s.ranks, grows, s.k, s.rows, s.k, s.n, s.rounds);
  double median[kVariants];
  for (int v = 0; v < kVariants; ++v) {
    std::vector<double> t;
    for (int r = 0; r < s.rounds; ++r) t.push_back(times[r * kVariants + v]);
    median[v] = Median(t);
    std::printf("  %-32s median %10.1f us  best %10.1f us\n", kNames[v], median[v],
                *std::min_element(t.begin(), t.end()));
  }
  std::printf(
      "  fused / unfused (medians): all-gather+matmul %.2f, matmul+reduce-scatter %.2f "
      "(target <= 0.80)\n",
      median[kFusedAg] / median[kUnfusedAg], median[kFusedRs] / median[kUnfusedRs]);
  std::printf(
      "  memory per rank beyond operands and outputs: all-gather+matmul fused 0 B, "
      "unfused %zu B (the gathered A); matmul+reduce-scatter %zu B either way (fused: "
      "the partial products' workspace, unfused: the full product)\n",
      grows * s.k * 4, grows * s.n * 4);
  return 0;
}
