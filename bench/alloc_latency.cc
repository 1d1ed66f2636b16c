// Symmetric allocation cost against a real commd:
//   - for 2 and 8 rank processes, AllocateSymmetric(1 MiB): from the moment the last rank
//     asks until every rank holds every peer's mapping (the collective's latency);
//   - for one rank, AllocateSymmetric + mapping as a round trip, next to the empty-RPC floor
//     of the same gRPC stack measured in the same run.
//
//   build/bench/alloc_latency [--iterations N]
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "bench/floor.h"
#include "bench/rank_processes.h"
#include "commd/commd.h"
#include "tests/integration/daemon_process.h"

namespace {

constexpr size_t kBytes = 1 << 20;

struct Stamp {
  int64_t asked_ns;
  int64_t mapped_ns;
};

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

// One rank: join, then `iterations` times allocate (touching one byte of every peer mapping so
// the mapping is really there) and record when it asked and when it held every mapping.
void RunRank(const std::string& dir, int rank, int world, int iterations, Stamp* stamps) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto client = commd::Client::Connect({.runtime_dir = dir, .job_id = "bench"});
  if (!client.ok()) ::_exit(1);
  auto group = (*client)->JoinGroup(
      {.name = "g" + std::to_string(world), .rank = rank, .world_size = world});
  if (!group.ok()) ::_exit(2);
  for (int i = 0; i < iterations; ++i) {
    Stamp& s = stamps[i * world + rank];
    s.asked_ns = NowNs();
    auto buf = (*group)->AllocateSymmetric(kBytes);
    if (!buf.ok()) ::_exit(3);
    volatile char sink = 0;
    for (int r = 0; r < world; ++r) sink += static_cast<char*>((*buf)->peer(r))[0];
    s.mapped_ns = NowNs();
  }
  ::_exit(0);
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

// Collective latency per iteration: last rank's ask to last rank's full mapping.
void MeasureWorld(const std::string& dir, int world, int iterations) {
  auto* stamps =
      static_cast<Stamp*>(::mmap(nullptr, sizeof(Stamp) * world * iterations,
                                 PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (!commd::bench::RunRankProcesses(world,
                                      [&](int r) { RunRank(dir, r, world, iterations, stamps); })) {
    std::printf("%d ranks: a rank failed\n", world);
    return;
  }
  std::vector<double> ms;
  for (int i = 1; i < iterations; ++i) {  // the first includes connection warm-up
    int64_t last_ask = 0, last_map = 0;
    for (int r = 0; r < world; ++r) {
      last_ask = std::max(last_ask, stamps[i * world + r].asked_ns);
      last_map = std::max(last_map, stamps[i * world + r].mapped_ns);
    }
    ms.push_back((last_map - last_ask) / 1e6);
  }
  std::printf(
      "AllocateSymmetric 1 MiB, %d ranks: p50 %.3f ms, p90 %.3f ms, max %.3f ms "
      "(target < 5 ms for 8 ranks)\n",
      world, Percentile(ms, 0.5), Percentile(ms, 0.9), Percentile(ms, 1.0));
  ::munmap(stamps, sizeof(Stamp) * world * iterations);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  if (argc == 3 && std::strcmp(argv[1], "--iterations") == 0) iterations = std::atoi(argv[2]);
  commd::testing::TempDir tmp;
  auto daemon = commd::testing::DaemonProcess::Start(tmp.Join("run"));
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  const std::string dir = (*daemon)->runtime_dir();
  // The multi-rank runs fork before this process starts any gRPC thread of its own.
  MeasureWorld(dir, 2, iterations);
  MeasureWorld(dir, 8, iterations);

  commd::bench::FloorServer floor(tmp.Join("floor.sock"));
  auto client = commd::Client::Connect({.runtime_dir = dir, .job_id = "bench1"});
  auto group = (*client)->JoinGroup({.name = "solo", .rank = 0, .world_size = 1});
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }
  const auto floor_stats = commd::bench::MeasureLatency(iterations * 10, [&] { floor.Ping(); });
  // Allocate + import + map, timed; the release (another RPC) happens outside the timing.
  std::vector<std::unique_ptr<commd::SymmetricBuffer>> held;
  const auto alloc_stats = commd::bench::MeasureLatency(iterations * 10, [&] {
    auto buf = (*group)->AllocateSymmetric(kBytes);
    static_cast<char*>((*buf)->data())[0] = 1;
    held.push_back(*std::move(buf));
  });
  held.clear();
  std::printf("floor: empty unary RPC                p50 %8.1f us  p99 %8.1f us\n",
              floor_stats.p50_us, floor_stats.p99_us);
  std::printf("1 rank: AllocateSymmetric + map       p50 %8.1f us  p99 %8.1f us\n",
              alloc_stats.p50_us, alloc_stats.p99_us);
  std::printf("ratio p50: %.2f (target <= 3)\n", alloc_stats.p50_us / floor_stats.p50_us);
  return 0;
}
