// The MPI baseline of bench/allreduce_vs_mpi.sh: MPI_Allreduce (in place, float sum) over a
// size sweep, or MPI_Barrier (-op barrier: one row of size 0), timed like commd-bench
// (slowest rank's mean per iteration), same columns.
//
//   mpirun -np 2 build/bench/mpi_allreduce -b 8 -e 64M -f 2 -w 5 -i 20
//   mpirun -np 2 build/bench/mpi_allreduce -op barrier -w 1000 -i 20000
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

size_t ParseSize(const char* text) {
  char* end = nullptr;
  size_t v = std::strtoull(text, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  if (*end == 'G' || *end == 'g') v <<= 30;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  size_t min_bytes = 8, max_bytes = size_t{64} << 20;
  double factor = 2;
  int warmup = 5, iters = 20;
  bool barrier = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "-b")
      min_bytes = ParseSize(argv[i + 1]);
    else if (f == "-e")
      max_bytes = ParseSize(argv[i + 1]);
    else if (f == "-f")
      factor = std::atof(argv[i + 1]);
    else if (f == "-w")
      warmup = std::atoi(argv[i + 1]);
    else if (f == "-i")
      iters = std::atoi(argv[i + 1]);
    else if (f == "-op" && std::string(argv[i + 1]) == "barrier")
      barrier = true;
    else if (f == "-op" && std::string(argv[i + 1]) == "allreduce")
      barrier = false;
    else {
      if (rank == 0) std::fprintf(stderr, "mpi_allreduce: unknown flag %s\n", f.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (factor < 1.01 || min_bytes < 4 || min_bytes > max_bytes || iters < 1) {
    if (rank == 0) std::fprintf(stderr, "mpi_allreduce: need -f >= 1.01, 4 <= -b <= -e, -i >= 1\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rank == 0) {
    std::printf("%12s %12s %9s %6s %8s %11s %8s %8s\n", "size(B)", "count", "type", "redop", "algo",
                "time(us)", "algbw", "busbw");
  }
  if (barrier) {
    for (int i = 0; i < warmup; ++i) MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) MPI_Barrier(MPI_COMM_WORLD);
    double mine = (MPI_Wtime() - t0) / iters, worst = 0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("%12d %12d %9s %6s %8s %11.2f %8.3f %8.3f\n", 0, 0, "-", "-", "mpi", worst * 1e6,
                  0.0, 0.0);
    }
    MPI_Finalize();
    return 0;
  }
  std::vector<float> buf(max_bytes / sizeof(float), 1.0f);
  size_t last = 0;
  for (double s = static_cast<double>(min_bytes); s <= max_bytes * (1 + 1e-9); s *= factor) {
    const size_t count = static_cast<size_t>(s) / sizeof(float);
    if (count == 0 || count * sizeof(float) == last) continue;
    last = count * sizeof(float);
    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
    // Keep the values bounded: the sums of ones grow, but stay finite over any sweep.
    std::fill(buf.begin(), buf.begin() + count, 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
    }
    double mine = (MPI_Wtime() - t0) / iters, worst = 0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const double bytes = static_cast<double>(count * sizeof(float));
      const double algbw = bytes / worst / 1e9;
      std::printf("%12zu %12zu %9s %6s %8s %11.2f %8.3f %8.3f\n", count * sizeof(float), count,
                  "float", "sum", "mpi", worst * 1e6, algbw, algbw * 2.0 * (world - 1) / world);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
