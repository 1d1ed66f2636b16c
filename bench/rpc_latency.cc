// GetStatus round trip through the SDK to a real commd, next to the floor of the same stack:
// an empty unary RPC served by a gRPC callback server in another process, over a unix socket
// in the same runtime dir, measured in the same run. Also reports the daemon's idle RSS.
//
//   build/bench/rpc_latency [--calls N]
//
// Prints one row per measurement and the ratio p50(GetStatus) / p50(floor).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/floor.h"
#include "commd/commd.h"
#include "tests/integration/daemon_process.h"

namespace {

using commd::bench::LatencyStats;

void Row(const char* name, const LatencyStats& s) {
  std::printf("%-34s %10.1f %10.1f %10.1f\n", name, s.p50_us, s.p99_us, s.mean_us);
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 20000;
  if (argc == 3 && std::strcmp(argv[1], "--calls") == 0) calls = std::atoi(argv[2]);
  commd::testing::TempDir tmp;
  auto daemon = commd::testing::DaemonProcess::Start(tmp.Join("run"));
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  absl::SleepFor(absl::Seconds(2));
  const long idle_rss = (*daemon)->RssKib();

  commd::bench::FloorServer floor(tmp.Join("floor.sock"));

  commd::ClientOptions options;
  options.runtime_dir = (*daemon)->runtime_dir();
  auto client = commd::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }

  std::printf("# %d calls each, one client thread, unix sockets\n", calls);
  std::printf("%-34s %10s %10s %10s\n", "rpc", "p50_us", "p99_us", "mean_us");
  const LatencyStats floor_stats = commd::bench::MeasureLatency(calls, [&] { floor.Ping(); });
  Row("floor: empty unary (callback srv)", floor_stats);
  const LatencyStats status_stats =
      commd::bench::MeasureLatency(calls, [&] { (void)(*client)->GetStatus(); });
  Row("commd GetStatus via SDK", status_stats);
  std::printf("GetStatus/floor p50 ratio: %.2f (target <= 1.5)\n",
              status_stats.p50_us / floor_stats.p50_us);
  std::printf("daemon RSS idle: %.1f MB (target < 30), after load: %.1f MB\n", idle_rss / 1024.0,
              (*daemon)->RssKib() / 1024.0);
  return 0;
}
