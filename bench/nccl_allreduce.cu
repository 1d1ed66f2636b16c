// NCCL's all-reduce on every GPU of this node (up to 8), one process, for scripts/gpu-tests to
// print next to commd's figures (CollectiveTest.CudaAllReduceFiguresOnGpus): the same sizes,
// the same type (fp32 sum), timed the same way (CUDA events around back-to-back calls after
// 10 unmeasured ones). Built by scripts/gpu-tests with nvcc when NCCL is found; not part of
// the CMake or Bazel build (the project does not depend on NCCL).
//
//   nccl_allreduce [GPUS]    prints "BENCH nccl <what> <value>" lines
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CHECK(call, ok)                                                                           \
  do {                                                                                            \
    if (auto r_ = (call); r_ != (ok)) {                                                           \
      std::fprintf(stderr, "%s failed (%d) at line %d\n", #call, static_cast<int>(r_), __LINE__); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

struct Rank {
  ncclComm_t comm;
  cudaStream_t stream;
  float* buf;
};

// One all-reduce of `count` floats in place on every GPU, as one NCCL group.
void AllReduce(std::vector<Rank>& ranks, size_t count) {
  CHECK(ncclGroupStart(), ncclSuccess);
  for (size_t g = 0; g < ranks.size(); ++g) {
    CHECK(cudaSetDevice(static_cast<int>(g)), cudaSuccess);
    CHECK(ncclAllReduce(ranks[g].buf, ranks[g].buf, count, ncclFloat, ncclSum, ranks[g].comm,
                        ranks[g].stream),
          ncclSuccess);
  }
  CHECK(ncclGroupEnd(), ncclSuccess);
}

// Mean microseconds per call over `iters` calls, timed on GPU 0's stream after all GPUs
// finished the warm-up.
double Time(std::vector<Rank>& ranks, size_t count, int iters) {
  for (int i = 0; i < 10; ++i) AllReduce(ranks, count);
  for (size_t g = 0; g < ranks.size(); ++g) {
    CHECK(cudaSetDevice(static_cast<int>(g)), cudaSuccess);
    CHECK(cudaStreamSynchronize(ranks[g].stream), cudaSuccess);
  }
  CHECK(cudaSetDevice(0), cudaSuccess);
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start), cudaSuccess);
  CHECK(cudaEventCreate(&stop), cudaSuccess);
  CHECK(cudaEventRecord(start, ranks[0].stream), cudaSuccess);
  for (int i = 0; i < iters; ++i) AllReduce(ranks, count);
  CHECK(cudaSetDevice(0), cudaSuccess);
  CHECK(cudaEventRecord(stop, ranks[0].stream), cudaSuccess);
  CHECK(cudaEventSynchronize(stop), cudaSuccess);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  return ms * 1e3 / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices), cudaSuccess);
  const int n = std::min(argc > 1 ? std::atoi(argv[1]) : devices, std::min(devices, 8));
  if (n < 2) {
    std::fprintf(stderr, "needs 2 GPUs, found %d\n", devices);
    return 1;
  }
  const size_t small = 8 << 10, large = size_t{64} << 20;
  std::vector<Rank> ranks(n);
  std::vector<int> list(n);
  for (int g = 0; g < n; ++g) list[g] = g;
  std::vector<ncclComm_t> comms(n);
  CHECK(ncclCommInitAll(comms.data(), n, list.data()), ncclSuccess);
  for (int g = 0; g < n; ++g) {
    CHECK(cudaSetDevice(g), cudaSuccess);
    ranks[g].comm = comms[g];
    CHECK(cudaStreamCreate(&ranks[g].stream), cudaSuccess);
    CHECK(cudaMalloc(&ranks[g].buf, large), cudaSuccess);
    CHECK(cudaMemset(ranks[g].buf, 0, large), cudaSuccess);
  }
  const double small_us = Time(ranks, small / 4, 1000);
  const double large_us = Time(ranks, large / 4, 20);
  std::printf("BENCH nccl allreduce_8KiB_latency_us %.2f\n", small_us);
  std::printf("BENCH nccl allreduce_64MiB_busbw_GBps %.1f\n",
              2.0 * (n - 1) / n * static_cast<double>(large) / (large_us * 1e3));
  for (int g = 0; g < n; ++g) {
    CHECK(cudaSetDevice(g), cudaSuccess);
    cudaFree(ranks[g].buf);
    cudaStreamDestroy(ranks[g].stream);
    ncclCommDestroy(ranks[g].comm);
  }
  return 0;
}
