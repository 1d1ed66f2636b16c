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
#include "commd/commd.h"
#include "commd_bench/empty.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/daemon_process.h"

namespace {

class FloorService final : public commd_bench::Floor::CallbackService {
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const commd_bench::Empty*,
                                 commd_bench::Empty*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

// Runs the floor server in a child process until killed.
pid_t StartFloorServer(const std::string& socket) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  FloorService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  server->Wait();
  ::_exit(0);
}

struct Stats {
  double p50_us, p99_us, mean_us;
};

template <typename Fn>
Stats Measure(int calls, Fn&& call) {
  for (int i = 0; i < calls / 10; ++i) call();  // warm-up
  std::vector<double> us(calls);
  for (int i = 0; i < calls; ++i) {
    const absl::Time t0 = absl::Now();
    call();
    us[i] = absl::ToDoubleMicroseconds(absl::Now() - t0);
  }
  double sum = 0;
  for (double v : us) sum += v;
  std::sort(us.begin(), us.end());
  return {us[calls / 2], us[static_cast<size_t>(calls * 0.99)], sum / calls};
}

void Row(const char* name, const Stats& s) {
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

  const std::string floor_socket = tmp.Join("floor.sock");
  const pid_t floor_pid = StartFloorServer(floor_socket);
  auto channel = grpc::CreateChannel("unix:" + floor_socket, grpc::InsecureChannelCredentials());
  channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto floor = commd_bench::Floor::NewStub(channel);

  commd::ClientOptions options;
  options.runtime_dir = (*daemon)->runtime_dir();
  auto client = commd::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }

  std::printf("# %d calls each, one client thread, unix sockets\n", calls);
  std::printf("%-34s %10s %10s %10s\n", "rpc", "p50_us", "p99_us", "mean_us");
  const Stats floor_stats = Measure(calls, [&] {
    grpc::ClientContext ctx;
    commd_bench::Empty in, out;
    floor->Ping(&ctx, in, &out);
  });
  Row("floor: empty unary (callback srv)", floor_stats);
  const Stats status_stats = Measure(calls, [&] { (void)(*client)->GetStatus(); });
  Row("commd GetStatus via SDK", status_stats);
  std::printf("GetStatus/floor p50 ratio: %.2f (target <= 1.5)\n",
              status_stats.p50_us / floor_stats.p50_us);
  std::printf("daemon RSS idle: %.1f MB (target < 30), after load: %.1f MB\n", idle_rss / 1024.0,
              (*daemon)->RssKib() / 1024.0);
  ::kill(floor_pid, SIGKILL);
  ::waitpid(floor_pid, nullptr, 0);
  return 0;
}
