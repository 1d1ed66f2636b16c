// The SDK's own work per collective call, for a profiler: one rank (a world of one, so no
// peer is waited for and every call does the same work) of a private commd runs `--calls N`
// small collectives in RunCalls, after `--warmup` untimed ones (first-call allocations).
// Under callgrind the instructions of RunCalls divided by N are the cost of one call,
// independent of the machine's load; bench/sdk_call_cost.sh does that and prints the
// breakdown by function.
//
//   build/bench/sdk_call_cost [--mode sym|host|barrier] [--bytes B] [--calls N] [--warmup N]
//
//   sym:     Group::AllReduce(SymmetricBuffer&, B / 4, fp32, sum)
//   host:    Group::AllReduce(const void*, void*, B / 4, fp32, sum, staging)
//   barrier: Group::Barrier()
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/daemon_process.h"

namespace {

enum class Mode { kSym, kHost, kBarrier };

struct Flags {
  Mode mode = Mode::kSym;
  std::string mode_name = "sym";
  size_t bytes = 8;
  long calls = 2000;
  long warmup = 100;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "sdk_call_cost: %s\nusage: sdk_call_cost [--mode sym|host|barrier] [--bytes B "
               "(4 to 1048576, a multiple of 4)] [--calls N (1 to 10^8)] [--warmup N (0 to "
               "10^8)]\n",
               why);
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) Usage("a flag without a value");
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--mode") {
      f.mode_name = v;
      if (f.mode_name == "sym") {
        f.mode = Mode::kSym;
      } else if (f.mode_name == "host") {
        f.mode = Mode::kHost;
      } else if (f.mode_name == "barrier") {
        f.mode = Mode::kBarrier;
      } else {
        Usage("unknown --mode");
      }
    } else if (flag == "--bytes") {
      f.bytes = std::strtoul(v, nullptr, 10);
      if (f.bytes < 4 || f.bytes > (1u << 20) || f.bytes % 4 != 0) Usage("--bytes out of range");
    } else if (flag == "--calls") {
      f.calls = std::atol(v);
      if (f.calls < 1 || f.calls > 100000000) Usage("--calls out of range");
    } else if (flag == "--warmup") {
      f.warmup = std::atol(v);
      if (f.warmup < 0 || f.warmup > 100000000) Usage("--warmup out of range");
    } else {
      Usage("unknown flag");
    }
  }
  return f;
}

struct Target {
  commd::Group* group;
  commd::SymmetricBuffer* buf;    // sym: the data; host: the staging buffer
  std::vector<float>* host_data;  // host: the application's memory
};

// What callgrind measures (--toggle-collect): `calls` collectives, nothing else.
[[gnu::noinline]] absl::Status RunCalls(const Flags& f, const Target& t, long calls) {
  const size_t count = f.bytes / sizeof(float);
  absl::Status st;
  for (long i = 0; i < calls && st.ok(); ++i) {
    if (f.mode == Mode::kSym) {
      st = t.group->AllReduce(*t.buf, count, commd::DataType::kFloat32, commd::ReduceOp::kSum);
    } else if (f.mode == Mode::kHost) {
      st = t.group->AllReduce(t.host_data->data(), t.host_data->data(), count,
                              commd::DataType::kFloat32, commd::ReduceOp::kSum, *t.buf);
    } else {
      st = t.group->Barrier();
    }
  }
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  commd::testing::TempDir tmp;
  auto daemon = commd::testing::DaemonProcess::Start(tmp.path());
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  auto client =
      commd::Client::Connect({.runtime_dir = (*daemon)->runtime_dir(), .job_id = "sdk-call-cost"});
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto group = (*client)->JoinGroup({.name = "cost", .rank = 0, .world_size = 1});
  if (!group.ok()) {
    std::fprintf(stderr, "join: %s\n", group.status().ToString().c_str());
    return 1;
  }
  auto buf = (*group)->AllocateSymmetric(f.bytes);
  if (!buf.ok()) {
    std::fprintf(stderr, "allocate: %s\n", buf.status().ToString().c_str());
    return 1;
  }
  std::memset((*buf)->data(), 0, (*buf)->size());
  std::vector<float> host_data(f.bytes / sizeof(float), 1.0f);
  const Target t{group->get(), buf->get(), &host_data};
  absl::Status st = RunCalls(f, t, f.warmup);
  const absl::Time t0 = absl::Now();
  if (st.ok()) st = RunCalls(f, t, f.calls);
  const absl::Duration took = absl::Now() - t0;
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", f.mode_name.c_str(), st.ToString().c_str());
    return 1;
  }
  std::printf("mode %s, %zu B, %ld calls: %.3f us per call (wall clock)\n", f.mode_name.c_str(),
              f.bytes, f.calls, absl::ToDoubleMicroseconds(took) / static_cast<double>(f.calls));
  return 0;
}
