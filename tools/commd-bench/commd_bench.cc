// commd-bench: host collective bandwidth and latency over a running commd, in the style of
// nccl-tests. Forks -n rank processes that each connect to the daemon, join one group,
// allocate symmetric buffers and run the chosen collective over a size sweep, by default
// through the SDK (Group::AllReduce, ...), with --path kernel through the bare kernels.
//
//   commd-bench -n 2 -b 8 -e 64M -f 2 --op allreduce -d float -o sum -c
//
// Without --runtime-dir it starts its own daemon (the `commd` next to this binary, else the
// build tree's, else $PATH) on a temporary runtime dir and stops it at the end.
// Run `commd-bench --help` for every flag.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/child_process.h"
#include "tools/commd-bench/ceiling.h"
#include "tools/commd-bench/options.h"
#include "tools/commd-bench/rank.h"

namespace {

using commd::CollectiveOp;
using commd::bench::Options;
using commd::bench::Shared;
using commd::testing::DaemonProcess;

std::string FindDaemon() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = 0;
    std::string dir(self);
    dir = dir.substr(0, dir.rfind('/'));
    if (::access((dir + "/commd").c_str(), X_OK) == 0) return dir + "/commd";
  }
  const std::string built = DaemonProcess::DefaultBinary();
  if (::access(built.c_str(), X_OK) == 0) return built;
  return "commd";  // looked up in $PATH
}

// A private daemon on a runtime dir under `dir`, its all-reduce threshold the bench's, so
// that the SDK path chooses the algorithm the rows say.
std::unique_ptr<DaemonProcess> StartPrivateDaemon(const Options& o,
                                                  const commd::testing::TempDir& dir) {
  if (dir.path().empty()) {
    std::perror("commd-bench: cannot create a temporary directory");
    return nullptr;
  }
  auto daemon = commd::testing::StartDaemonWithConfig(
      dir, absl::StrCat("collectives { one_shot_max_read_bytes: ", o.one_shot_max_read_bytes, " }"),
      {}, FindDaemon());
  if (!daemon.ok()) {
    std::fprintf(stderr, "commd-bench: private daemon: %s\n", daemon.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*daemon);
}

void SetError(Shared* shared, const char* message) {
  if (shared->failed.exchange(1) == 0) {
    std::snprintf(shared->error, sizeof(shared->error), "%s", message);
  }
}

// Waits for every rank. A rank that fails leaves its peers waiting, and so does a private
// daemon that exits: then the remaining ranks are killed. The daemon is left for its
// ChildProcess to reap (waitid's WNOWAIT only looks).
bool WaitForRanks(std::vector<pid_t> live, const DaemonProcess* daemon, Shared* shared) {
  bool ok = true;
  auto stop_all = [&] {
    for (pid_t p : live) ::kill(p, SIGKILL);
  };
  while (!live.empty()) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      break;
    }
    const pid_t pid = info.si_pid;
    const auto it = std::find(live.begin(), live.end(), pid);
    if (it == live.end()) {
      if (daemon == nullptr || pid != daemon->pid()) {
        ::waitpid(pid, nullptr, 0);  // not ours to watch
        continue;
      }
      SetError(shared, "the private commd exited");
      stop_all();
      for (pid_t p : live) ::waitpid(p, nullptr, 0);
      return false;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    live.erase(it);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (ok) stop_all();
      ok = false;
    }
  }
  return ok;
}

// Each all-reduce row's limit, measured in this run before the ranks start (so they do not
// compete with it); smaller sizes are bound by latency, not by memory, and get none.
void MeasureCeilings(const Options& o, std::vector<commd::bench::Size>* sizes) {
  const bool all_reduce =
      o.op == CollectiveOp::kAllReduce || o.op == CollectiveOp::kAllReduceCoalesced;
  if (!all_reduce || o.ranks < 2) return;
  for (commd::bench::Size& s : *sizes) {
    if (s.bytes < (size_t{64} << 10)) continue;
    const commd::bench::Ceiling c = commd::bench::MeasureCeiling(s.bytes, o.ranks);
    s.ceiling_busbw = commd::bench::AllReduceBusBwCeiling(c, o.ranks);
    std::printf("# ceiling %zu B: %d-thread copy %.2f GB/s, read+write %.2f GB/s -> busbw %.2f\n",
                s.bytes, std::min(o.ranks, static_cast<int>(std::thread::hardware_concurrency())),
                c.copy_gbps, c.read_write_gbps, s.ceiling_busbw);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = commd::bench::ParseFlags(argc, argv);
  std::vector<commd::bench::Size> sizes = commd::bench::Sizes(o);
  if (sizes.empty()) {
    const char* unit = o.op == CollectiveOp::kAllReduce            ? ""
                       : o.op == CollectiveOp::kAllReduceCoalesced ? " per tensor"
                                                                   : " per rank";
    commd::bench::BadFlag(absl::StrCat("no size in -b ", o.min_bytes, " .. -e ", o.max_bytes,
                                       " holds a whole element", unit, " of ",
                                       commd::DataTypeName(o.dtype)));
  }

  commd::testing::TempDir tmp("commd-bench");  // removed with its contents at the end
  std::unique_ptr<DaemonProcess> daemon;
  std::string dir = o.runtime_dir;
  if (dir.empty()) {
    daemon = StartPrivateDaemon(o, tmp);
    if (daemon == nullptr) return 1;
    dir = daemon->runtime_dir();
  }

  auto* shared = static_cast<Shared*>(
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) {
    std::perror("commd-bench: mmap");
    return 1;
  }
  new (shared) Shared{};

  const std::string calls =
      o.interleaved ? absl::StrCat(commd::bench::PathCall(commd::bench::Path::kSdk, o.op), ", ",
                                   commd::bench::PathCall(commd::bench::Path::kKernel, o.op), "; ",
                                   o.rounds, " alternating rounds per size")
                    : commd::bench::PathCall(o.path, o.op);
  std::printf("# commd-bench: %s, path %s (%s), %d ranks, warm-up %d, iterations %d, %s\n",
              commd::bench::OpName(o.op), commd::bench::PathNames(o), calls.c_str(), o.ranks,
              o.warmup, o.iters,
              o.runtime_dir.empty() ? "private daemon" : ("daemon at " + dir).c_str());
  MeasureCeilings(o, &sizes);
  commd::bench::PrintHeader(o);
  std::fflush(stdout);

  const std::string group_name = absl::StrCat("commd-bench-", ::getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      commd::bench::RunRank(o, r, shared, dir, group_name, sizes);
    }
    if (pid < 0) {
      SetError(shared, "fork of a rank process failed");
      for (pid_t p : pids) ::kill(p, SIGKILL);
      break;
    }
    pids.push_back(pid);
  }
  bool ok = WaitForRanks(pids, daemon.get(), shared) && !shared->failed.load();
  if (!ok) {
    std::fprintf(stderr, "commd-bench: %s\n",
                 shared->failed.load() ? shared->error : "a rank process died");
    if (daemon != nullptr) std::fprintf(stderr, "commd log:\n%s", daemon->Log().c_str());
  }
  if (daemon != nullptr) (void)daemon->Stop(SIGTERM);
  if (ok && shared->wrong.load() > 0) {
    std::fprintf(stderr, "commd-bench: --check found %llu wrong elements\n",
                 static_cast<unsigned long long>(shared->wrong.load()));
    ok = false;
  }
  return ok ? 0 : 1;
}
