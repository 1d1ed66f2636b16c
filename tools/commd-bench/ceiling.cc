#include "tools/commd-bench/ceiling.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace commd::bench {
namespace {

using Clock = std::chrono::steady_clock;

// 16 bytes at a time through the compiler's vector extension (SSE2 on x86-64): the pass is
// then bounded by memory, not by a scalar loop, from L2-sized buffers up.
using Lane = uint64_t __attribute__((vector_size(16)));

void ReadWritePass(std::byte* p, size_t bytes) {
  const Lane one = {1, 1};
  size_t i = 0;
  for (; i + sizeof(Lane) <= bytes; i += sizeof(Lane)) {
    Lane v;
    std::memcpy(&v, p + i, sizeof(v));
    v += one;
    std::memcpy(p + i, &v, sizeof(v));
  }
  for (; i < bytes; ++i) p[i] = static_cast<std::byte>(static_cast<uint8_t>(p[i]) + 1);
}

// Runs `passes` passes of `pass(thread)` on `threads` threads released together; returns
// the seconds from the release to the last thread's end.
template <typename Pass>
double TimedRound(int threads, int passes, const Pass& pass) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (int i = 0; i < passes; ++i) pass(t);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const Clock::time_point start = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Ceiling MeasureCeiling(size_t bytes_per_rank, int ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, std::min(ranks, cores));
  // Threads share the ranks' bytes: n S in all, as the all-reduce moves.
  const size_t total = bytes_per_rank * static_cast<size_t>(ranks);
  const size_t per_thread = std::max<size_t>(64, total / static_cast<size_t>(threads));
  std::vector<std::vector<std::byte>> src(threads), dst(threads);
  for (int t = 0; t < threads; ++t) {
    src[t].assign(per_thread, std::byte{1});  // touched: no page faults in the timed passes
    dst[t].assign(per_thread, std::byte{2});
  }
  const int passes = static_cast<int>(std::max<size_t>(1, (size_t{32} << 20) / total));
  const double bytes = static_cast<double>(per_thread) * threads * passes;
  Ceiling c;
  for (int round = 0; round < 5; ++round) {
    const double copy = TimedRound(
        threads, passes, [&](int t) { std::memcpy(dst[t].data(), src[t].data(), per_thread); });
    const double rw =
        TimedRound(threads, passes, [&](int t) { ReadWritePass(src[t].data(), per_thread); });
    c.copy_gbps = std::max(c.copy_gbps, bytes / copy / 1e9);
    c.read_write_gbps = std::max(c.read_write_gbps, bytes / rw / 1e9);
  }
  return c;
}

double AllReduceBusBwCeiling(const Ceiling& c, int ranks) {
  const double n = ranks;
  return std::max(c.copy_gbps, c.read_write_gbps) * 2 * (n - 1) / (n * n);
}

}  // namespace commd::bench
