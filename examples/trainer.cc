// A small data-parallel "trainer" on commd: one process per rank joins a group, allocates a
// symmetric gradient buffer, and runs a loop of all-reduces over it, checking every result.
// Flags inject the faults commd is there to catch, so that a newcomer (and the dashboards
// test) can watch the watchdog, the flight recorder and the metrics react:
//
//   trainer --group dp --rank 0 --world 4 --steps 200 --step-ms 20 &
//   trainer --group dp --rank 1 --world 4 --steps 200 --step-ms 20 --hang-at-step 50 &
//   ...
//
// --hang-at-step N   this rank stops before collective N (sleeps until killed): the others
//                    wait in it, and the daemon reports the group as hung, naming this rank.
// --nan-at-step N    this rank puts a NaN into its input at step N; every rank sees it in the
//                    result and says so.
//
// The all-reduce is the SDK's Group::AllReduce (in place, with the fused NaN/Inf check on),
// so the daemon's watchdog, flight recorder and NaN counters (commd_nan_detected_total) see
// every step.
//
// Exit status: 0 all steps done and correct, 1 a call failed, 2 bad flags, 3 aborted by the
// daemon (ABORTED), 4 a wrong all-reduce result.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "commd/commd.h"

namespace {

struct Flags {
  std::string group = "dp";
  int rank = -1;
  int world = -1;
  int steps = 100;
  size_t count = 4096;  // float32 elements per all-reduce
  int step_ms = 10;     // "compute" between collectives
  int hang_at_step = -1;
  int nan_at_step = -1;
  int timeout_ms = 60000;  // the group's timeout: the watchdog calls a collective hung after it
  int wait_ms = 0;         // how long a rank waits for its peers itself; 0: twice --timeout-ms
  bool quiet = false;
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "trainer: %s\nusage: trainer --rank R --world W [--group NAME] [--steps N] "
               "[--count ELEMENTS] [--step-ms MS] [--hang-at-step N] [--nan-at-step N] "
               "[--timeout-ms MS] [--wait-ms MS] [--quiet]\n",
               why);
  return 2;
}

bool ParseFlags(int argc, char** argv, Flags& f, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quiet") {
      f.quiet = true;
      continue;
    }
    if (i + 1 >= argc) {
      error = arg + " needs a value";
      return false;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (arg == "--group") {
      f.group = v;
    } else if (arg == "--rank") {
      ok = absl::SimpleAtoi(v, &f.rank);
    } else if (arg == "--world") {
      ok = absl::SimpleAtoi(v, &f.world);
    } else if (arg == "--steps") {
      ok = absl::SimpleAtoi(v, &f.steps) && f.steps >= 0;
    } else if (arg == "--count") {
      ok = absl::SimpleAtoi(v, &f.count) && f.count > 0;
    } else if (arg == "--step-ms") {
      ok = absl::SimpleAtoi(v, &f.step_ms) && f.step_ms >= 0;
    } else if (arg == "--hang-at-step") {
      ok = absl::SimpleAtoi(v, &f.hang_at_step);
    } else if (arg == "--nan-at-step") {
      ok = absl::SimpleAtoi(v, &f.nan_at_step);
    } else if (arg == "--timeout-ms") {
      ok = absl::SimpleAtoi(v, &f.timeout_ms) && f.timeout_ms > 0;
    } else if (arg == "--wait-ms") {
      ok = absl::SimpleAtoi(v, &f.wait_ms) && f.wait_ms >= 0;
    } else {
      error = "unknown flag " + arg;
      return false;
    }
    if (!ok) {
      error = "bad value " + std::string(v) + " for " + arg;
      return false;
    }
  }
  if (f.world < 1 || f.rank < 0 || f.rank >= f.world) {
    error = "--rank must be in [0, --world) and --world at least 1";
    return false;
  }
  return true;
}

int Fail(const std::string& what, const absl::Status& status) {
  std::printf("rank error: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::fflush(stdout);
  return status.code() == absl::StatusCode::kAborted ? 3 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  std::string error;
  if (!ParseFlags(argc, argv, f, error)) return Usage(error.c_str());

  auto client = commd::Client::Connect();  // $COMMD_RUNTIME_DIR, $COMMD_JOB_ID
  if (!client.ok()) return Fail("connect", client.status());
  commd::GroupOptions options;
  options.name = f.group;
  options.rank = f.rank;
  options.world_size = f.world;
  options.timeout = absl::Milliseconds(f.timeout_ms);
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) return Fail("join", group.status());
  auto grads = (*group)->AllocateSymmetric(f.count * sizeof(float));
  if (!grads.ok()) return Fail("allocate", grads.status());
  std::printf("rank %d/%d joined group %s\n", f.rank, f.world, f.group.c_str());
  std::fflush(stdout);

  float* data = static_cast<float*>((*grads)->data());
  for (int step = 0; step < f.steps; ++step) {
    absl::SleepFor(absl::Milliseconds(f.step_ms));  // the forward and backward pass
    (*group)->recorder().Heartbeat();
    if (step == f.hang_at_step) {
      std::printf("rank %d hangs before step %d (injected)\n", f.rank, step);
      std::fflush(stdout);
      for (;;) ::pause();
    }
    // Rank r contributes r + step + 1 everywhere; the sum is known in advance.
    for (size_t i = 0; i < f.count; ++i) data[i] = static_cast<float>(f.rank + step + 1);
    if (step == f.nan_at_step) {
      data[f.count / 2] = std::numeric_limits<float>::quiet_NaN();
      std::printf("rank %d puts a NaN into step %d (injected)\n", f.rank, step);
    }
    const absl::Status s =
        (*group)->AllReduce(**grads, f.count, commd::DataType::kFloat32, commd::ReduceOp::kSum,
                            {.timeout = absl::Milliseconds(f.wait_ms),
                             .nan_check = commd::CollectiveOptions::NanCheck::kOn});
    if (!s.ok()) return Fail("all-reduce at step " + std::to_string(step), s);
    const float want = static_cast<float>(f.world * (step + 1) + f.world * (f.world - 1) / 2);
    for (size_t i = 0; i < f.count; ++i) {
      if (std::isnan(data[i]) && i == f.count / 2) {
        std::printf("rank %d step %d: NaN in the all-reduce result\n", f.rank, step);
        std::fflush(stdout);
        continue;
      }
      if (data[i] != want) {
        std::printf("rank %d step %d: element %zu is %g, want %g\n", f.rank, step, i, data[i],
                    want);
        return 4;
      }
    }
    if (!f.quiet && (step % 50 == 0 || step + 1 == f.steps)) {
      std::printf("rank %d step %d ok\n", f.rank, step);
      std::fflush(stdout);
    }
  }
  std::printf("rank %d done: %d steps\n", f.rank, f.steps);
  return 0;
}
