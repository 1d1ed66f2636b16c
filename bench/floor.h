// The floor every daemon RPC is compared against: an empty unary RPC on a gRPC callback
// server in its own process, over a unix socket, with the same gRPC stack the daemon uses.
#ifndef COMMD_BENCH_FLOOR_H_
#define COMMD_BENCH_FLOOR_H_

#include <sys/types.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "commd_bench/empty.grpc.pb.h"

namespace commd::bench {

class FloorServer {
 public:
  // Forks the server process, listening on `socket`, and connects a stub to it.
  explicit FloorServer(const std::string& socket);
  ~FloorServer();  // kills the server process
  void Ping();     // one empty round trip

 private:
  pid_t pid_ = -1;
  std::unique_ptr<commd_bench::Floor::Stub> stub_;
};

struct LatencyStats {
  double p50_us = 0, p99_us = 0, mean_us = 0;
};

// Runs `call` calls/10 times to warm up, then `calls` times, timing each.
template <typename Fn>
LatencyStats MeasureLatency(int calls, Fn&& call) {
  for (int i = 0; i < calls / 10; ++i) call();
  std::vector<double> us(calls);
  double sum = 0;
  for (int i = 0; i < calls; ++i) {
    const absl::Time t0 = absl::Now();
    call();
    us[i] = absl::ToDoubleMicroseconds(absl::Now() - t0);
    sum += us[i];
  }
  std::sort(us.begin(), us.end());
  return {us[calls / 2], us[static_cast<size_t>(calls * 0.99)], sum / calls};
}

}  // namespace commd::bench

#endif  // COMMD_BENCH_FLOOR_H_
