// Watchdog figures against a real commd at the default poll interval (100 ms):
//  1. detection latency: 20 injected hangs (2 rank processes; rank 1 never enters
//     collective 2), each measured from the moment its timeout expired (rank 0 entered
//     seq 2, as it printed, + the group's timeout) to the diagnosis' detected time;
//  2. watchdog cost: the daemon's CPU time (utime + stime from /proc) over a window, with
//     8 ranks x 4 groups (32 rank processes) idle (heartbeating) and busy (collectives with
//     jitter), against the same daemon with no group; and the poll's own duration.
//
//   build/bench/watchdog_bench [--hangs N] [--window SECONDS] [--timeout-ms MS]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/daemon_process.h"

namespace {

using commd::testing::ChildProcess;
using commd::testing::DaemonProcess;

int flag_timeout_ms = 500;  // --timeout-ms

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  std::vector<std::string> f = absl::StrSplit(line.substr(close + 2), ' ');
  double utime = 0, stime = 0;
  (void)absl::SimpleAtod(f[11], &utime);  // fields 14 and 15, counted after the name
  (void)absl::SimpleAtod(f[12], &stime);
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::unique_ptr<ChildProcess> Rank(const DaemonProcess& d, const std::string& group, int rank,
                                   int world, const std::string& scenario, int n, int odd) {
  auto c = ChildProcess::Start(
      {WATCHDOG_RANK, group, std::to_string(rank), std::to_string(world), "report",
       std::to_string(flag_timeout_ms), scenario, std::to_string(n), std::to_string(odd)},
      {"COMMD_RUNTIME_DIR=" + d.runtime_dir(), "COMMD_JOB_ID=bench"});
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*c);
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

// One hang: returns detection latency in ms, or a negative value on failure.
double DetectOne(const DaemonProcess& d, commd::Client& client, int i) {
  const std::string group = absl::StrCat("h", i);
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  ranks.push_back(Rank(d, group, 0, 2, "lag", 2, 1));
  ranks.push_back(Rank(d, group, 1, 2, "lag", 2, 1));
  if (!ranks[0]->WaitForLog("WAITING 2 ", absl::Seconds(60))) return -1;
  const std::string log = ranks[0]->Log();
  int64_t entered_ns = 0;
  const size_t at = log.find("WAITING 2 ");
  (void)absl::SimpleAtoi(log.substr(at + 10, log.find('\n', at) - at - 10), &entered_ns);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    auto h = client.GetHealth(group);
    if (h.ok() && h->groups_size() > 0 && h->groups(0).has_last_diagnosis()) {
      const int64_t detected_ms = h->groups(0).last_diagnosis().detected_unix_ms();
      return static_cast<double>(detected_ms) -
             (static_cast<double>(entered_ns) / 1e6 + flag_timeout_ms);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

// The daemon's CPU share of one core over `window`, and the mean poll duration meanwhile.
std::pair<double, double> MeasureCpu(const DaemonProcess& d, absl::Duration window) {
  const double sum0 = commd::testing::MetricValue(d, "commd_watchdog_poll_duration_seconds_sum");
  const double n0 = commd::testing::MetricValue(d, "commd_watchdog_poll_duration_seconds_count");
  const double c0 = CpuSeconds(d.pid());
  absl::SleepFor(window);
  const double c1 = CpuSeconds(d.pid());
  const double sum1 = commd::testing::MetricValue(d, "commd_watchdog_poll_duration_seconds_sum");
  const double n1 = commd::testing::MetricValue(d, "commd_watchdog_poll_duration_seconds_count");
  const double poll_us = n1 > n0 ? (sum1 - sum0) / (n1 - n0) * 1e6 : 0;
  return {(c1 - c0) / absl::ToDoubleSeconds(window) * 100.0, poll_us};
}

}  // namespace

int main(int argc, char** argv) {
  int hangs = 20;
  int window_s = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--hangs") == 0) hangs = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--window") == 0) window_s = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--timeout-ms") == 0) flag_timeout_ms = std::atoi(argv[i + 1]);
  }
  commd::testing::TempDir tmp;
  auto daemon = commd::testing::StartDaemonWithConfig(tmp, "watchdog { poll_interval_ms: 100 }",
                                                      {"--dump-dir", tmp.Join("dumps")});
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  const DaemonProcess& d = **daemon;
  auto client = commd::Client::Connect({.runtime_dir = d.runtime_dir(), .job_id = "bench"});
  if (!client.ok()) return 1;

  std::vector<double> ms;
  for (int i = 0; i < hangs; ++i) {
    const double l = DetectOne(d, **client, i);
    if (l < 0) {
      std::fprintf(stderr, "hang %d was not detected\n", i);
      return 1;
    }
    ms.push_back(l);
  }
  std::printf(
      "detection latency over %d hangs (poll 100 ms, timeout %d ms): median %.0f ms, "
      "max %.0f ms, min %.0f ms\n",
      hangs, flag_timeout_ms, Percentile(ms, 0.5), Percentile(ms, 1.0), Percentile(ms, 0.0));

  const absl::Duration window = absl::Seconds(window_s);
  auto [base_cpu, base_poll] = MeasureCpu(d, window);
  std::printf("daemon CPU, no group:            %.3f%% of a core (poll %.1f us)\n", base_cpu,
              base_poll);
  for (const std::string scenario : {"idle", "busy"}) {
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int g = 0; g < 4; ++g) {
      for (int r = 0; r < 8; ++r) {
        ranks.push_back(Rank(d, absl::StrCat(scenario, g), r, 8, scenario, 0, 0));
      }
    }
    for (auto& r : ranks) {
      if (!r->WaitForLog(scenario == "idle" ? "IDLE" : "BUSY", absl::Seconds(120))) {
        std::fprintf(stderr, "rank failed: %s\n", r->Log().c_str());
        return 1;
      }
    }
    const double before =
        commd::testing::MetricValue(d, "commd_collectives_total{op=\"all_reduce\"}");
    auto [cpu, poll] = MeasureCpu(d, window);
    const double after =
        commd::testing::MetricValue(d, "commd_collectives_total{op=\"all_reduce\"}");
    std::printf(
        "daemon CPU, 8 ranks x 4 groups %s: %.3f%% of a core (poll %.1f us, %.0f "
        "collectives/s seen)\n",
        scenario.c_str(), cpu, poll, (after - before) / window_s);
  }
  return 0;
}
