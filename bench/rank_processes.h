// Rank processes for the multi-process benchmarks: fork `n` children that each run
// `rank(r)` (which must end the child with _exit), then wait for all of them.
//
//   bool ok = commd::bench::RunRankProcesses(4, [&](int r) { RunRank(dir, r, times); });
#ifndef COMMD_BENCH_RANK_PROCESSES_H_
#define COMMD_BENCH_RANK_PROCESSES_H_

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <vector>

namespace commd::bench {

// True when every child exited with status 0.
inline bool RunRankProcesses(int n, const std::function<void(int)>& rank) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      rank(r);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace commd::bench

#endif  // COMMD_BENCH_RANK_PROCESSES_H_
