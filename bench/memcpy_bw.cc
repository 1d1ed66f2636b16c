// The roofline of bench/allreduce_vs_mpi.sh: single-thread memcpy bandwidth between two
// buffers of -e bytes (each larger than the caches at the default), best of -i copies.
//
//   build/bench/memcpy_bw -e 64M -i 20     -> "memcpy 67108864 bytes: 9.87 GB/s"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  size_t bytes = size_t{64} << 20;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    char* end = nullptr;
    if (f == "-e") {
      bytes = std::strtoull(argv[i + 1], &end, 10);
      if (*end == 'K') bytes <<= 10;
      if (*end == 'M') bytes <<= 20;
      if (*end == 'G') bytes <<= 30;
    } else if (f == "-i") {
      iters = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "memcpy_bw: unknown flag %s (flags: -e BYTES, -i ITERATIONS)\n",
                   f.c_str());
      return 2;
    }
  }
  if (bytes == 0 || iters < 1) {
    std::fprintf(stderr, "memcpy_bw: -e must be > 0 and -i >= 1\n");
    return 2;
  }
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  // Bandwidth as bytes copied per second (each byte read once and written once).
  std::printf("memcpy %zu bytes: %.3f GB/s\n", bytes, bytes / best / 1e9);
  return a[bytes / 2] + b[bytes / 3] == 0;  // keep the copies observable
}
