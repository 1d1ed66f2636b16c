// One rank process of commd-bench: connects to the daemon, joins the group, allocates the
// symmetric buffers and runs the sweep on the chosen path (collective_path.h); rank 0
// prints a row per size from every rank's figures in the shared page.
//
//   Shared* shared = ...;                  // MAP_SHARED before fork
//   RunRank(options, rank, shared, runtime_dir, group_name, sizes);  // exits the process
#ifndef COMMD_TOOLS_COMMD_BENCH_RANK_H_
#define COMMD_TOOLS_COMMD_BENCH_RANK_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/commd-bench/options.h"

namespace commd::bench {

// Shared between the ranks and the parent (MAP_SHARED, set up before fork).
struct Shared {
  std::atomic<int> failed;
  std::atomic<uint64_t> wrong;  // --check: wrong elements over every row
  char error[512];
  struct Row {
    double seconds[kMaxRanks];
    uint64_t wrong[kMaxRanks];
  } row;
};

// Records `message` as the run's error (the first one wins) and exits the process with 1.
[[noreturn]] void Fail(Shared* shared, const std::string& message);

// Runs the sweep as `rank` and exits the process: 0 when done, 1 after Fail.
[[noreturn]] void RunRank(const Options& o, int rank, Shared* shared,
                          const std::string& runtime_dir, const std::string& group_name,
                          const std::vector<Size>& sizes);

// The table's header lines (or the CSV's), after the "# commd-bench" line.
void PrintHeader(const Options& o);

}  // namespace commd::bench

#endif  // COMMD_TOOLS_COMMD_BENCH_RANK_H_
