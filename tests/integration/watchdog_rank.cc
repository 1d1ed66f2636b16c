// One rank of a watchdog test job. It joins GROUP, runs collectives made of the flight
// recorder's Begin/Started/Completed around a real barrier on the signal pads of a symmetric
// buffer, and misbehaves as SCENARIO asks, so the daemon sees exact states:
//
//   watchdog_rank GROUP RANK WORLD POLICY TIMEOUT_MS SCENARIO N ODD [GAP_MS]
//     POLICY    default | report | notify | terminate
//     SCENARIO  fast      N collectives with jitter, a compute gap of GAP_MS, N more; "DONE"
//               lag       N-1 collectives; rank ODD sleeps before N, the others enter N and wait
//               mismatch  N-1 collectives; at N rank ODD records an all_gather, others all_reduce
//               stuck     N-1 collectives; every rank enters N, all but ODD complete it
//               silent    N-1 collectives; every rank enters N; ODD stops heartbeating
//               dead      N-1 collectives; ODD prints "VICTIM" and sleeps (to be killed), the
//                         others enter N and wait
//               leave     N-1 collectives; ODD closes its session cleanly ("LEFT") and lives
//                         on, the others enter N and wait
//               idle      prints "IDLE", heartbeats every 100 ms until killed (benchmarks)
//               busy      prints "BUSY", runs collectives with jitter until killed (benchmarks)
//               alloc     every rank but ODD prints "ASKING" and asks for a second symmetric
//                         buffer, then prints "ALLOC <status>"; ODD never asks
// Waiting ranks heartbeat, print "WAITING <seq> <unix ns when it entered seq>" once, and end with
// "ABORTED <reason>" when the daemon aborts the group (abort word) and "CALLBACK <status>" when the
// abort callback ran. Exit 0 after "DONE" or "ABORTED", 1 on an error. The rank named by
// $WATCHDOG_RANK_IGNORE_SIGTERM ignores SIGTERM (so only a SIGKILL ends it).
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/policy_arg.h"

namespace {

int Fail(const absl::Status& status) {
  std::printf("ERROR %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

class Rank {
 public:
  Rank(commd::Group& group, commd::SymmetricBuffer& buf) : group_(group), buf_(buf) {}

  // Sets this rank's pad word to `seq` and waits until every peer's is at least `seq`.
  absl::Status Barrier(uint64_t seq) {
    std::atomic_ref<uint32_t>(buf_.signal_pad(group_.rank())[0])
        .store(static_cast<uint32_t>(seq), std::memory_order_release);
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    for (int r = 0; r < group_.world_size(); ++r) {
      std::atomic_ref<uint32_t> flag(buf_.signal_pad(r)[0]);
      for (int spins = 0; flag.load(std::memory_order_acquire) < seq; ++spins) {
        if (group_.abort_requested()) return absl::AbortedError(group_.abort_reason());
        if (absl::Now() > deadline) return absl::DeadlineExceededError("barrier timed out");
        if (spins < 64) {
          sched_yield();
        } else {
          absl::SleepFor(absl::Microseconds(50));
        }
      }
    }
    return absl::OkStatus();
  }

  commd::RecordId Enter(commd::CollectiveOp op = commd::CollectiveOp::kAllReduce,
                        int64_t n = 1024) {
    dims_ = n;
    const commd::TensorDesc t{&dims_, 1, commd::DataType::kFloat32};
    entered_ns_ = absl::GetCurrentTimeNanos();
    commd::RecordId id = group_.recorder().Begin(op, {&t, 1}, {&t, 1});
    group_.recorder().Started(id);
    return id;
  }

  absl::Status Collective() {
    commd::RecordId id = Enter();
    if (auto s = Barrier(id.collective_seq_id); !s.ok()) {
      group_.recorder().Abandoned(id);
      return s;
    }
    group_.recorder().Completed(id);
    return absl::OkStatus();
  }

  // Waits, heartbeating (unless `silent`), until the daemon aborts the group.
  int WaitForAbort(uint64_t seq, bool silent) {
    Say("WAITING " + std::to_string(seq) + " " + std::to_string(entered_ns_));
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (!group_.abort_requested()) {
      if (absl::Now() > deadline) return Fail(absl::DeadlineExceededError("never aborted"));
      if (!silent) group_.recorder().Heartbeat();
      absl::SleepFor(absl::Milliseconds(10));
    }
    Say("ABORTED " + group_.abort_reason());
    absl::SleepFor(absl::Milliseconds(500));  // time for the abort event to arrive
    return 0;
  }

 private:
  commd::Group& group_;
  commd::SymmetricBuffer& buf_;
  int64_t dims_ = 0;
  int64_t entered_ns_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9) {
    std::fprintf(stderr,
                 "usage: watchdog_rank GROUP RANK WORLD POLICY TIMEOUT_MS SCENARIO N ODD "
                 "[GAP_MS]\n");
    return 2;
  }
  int rank = 0, world = 0, timeout_ms = 0, n = 0, odd = 0, gap_ms = 0;
  if (!absl::SimpleAtoi(argv[2], &rank) || !absl::SimpleAtoi(argv[3], &world) ||
      !absl::SimpleAtoi(argv[5], &timeout_ms) || !absl::SimpleAtoi(argv[7], &n) ||
      !absl::SimpleAtoi(argv[8], &odd) || (argc > 9 && !absl::SimpleAtoi(argv[9], &gap_ms))) {
    std::fprintf(stderr, "bad number\n");
    return 2;
  }
  const std::string scenario = argv[6];
  if (const char* ignore = std::getenv("WATCHDOG_RANK_IGNORE_SIGTERM");
      ignore != nullptr && std::to_string(rank) == ignore) {
    ::signal(SIGTERM, SIG_IGN);
  }
  auto client = commd::Client::Connect();
  if (!client.ok()) return Fail(client.status());
  commd::GroupOptions options{.name = argv[1], .rank = rank, .world_size = world};
  options.timeout = absl::Milliseconds(timeout_ms);
  options.watchdog_policy = commd::testing::ParsePolicy(argv[4]);
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) return Fail(group.status());
  (*group)->SetAbortCallback([](const absl::Status& s) { Say("CALLBACK " + s.ToString()); });
  auto buf = (*group)->AllocateSymmetric(4096);
  if (!buf.ok()) return Fail(buf.status());
  Rank me(**group, **buf);

  if (scenario == "idle") {
    Say("IDLE");
    for (;;) {
      (*group)->recorder().Heartbeat();
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  if (scenario == "busy") {
    Say("BUSY");
    std::mt19937 rng(static_cast<unsigned>(rank) * 7919 + 1);
    std::uniform_int_distribution<int> jitter_us(0, 300);
    for (int i = 0;; ++i) {
      if (i % 16 == 0) absl::SleepFor(absl::Microseconds(jitter_us(rng)));
      if (auto s = me.Collective(); !s.ok()) return Fail(s);
    }
  }
  if (scenario == "alloc") {  // every rank but ODD asks for a second buffer; ODD never does
    if (rank == odd) {
      Say("SLEEPING");
      while (!(*group)->abort_requested()) absl::SleepFor(absl::Milliseconds(20));
      Say("ABORTED " + (*group)->abort_reason());
      return 0;
    }
    Say("ASKING");
    auto second = (*group)->AllocateSymmetric(4096);
    Say("ALLOC " + second.status().ToString());
    return second.ok() ? 1 : 0;
  }
  if (scenario == "fast") {
    std::mt19937 rng(static_cast<unsigned>(rank) * 7919 + 1);
    std::uniform_int_distribution<int> jitter_us(0, 300);
    for (int phase = 0; phase < 2; ++phase) {
      for (int i = 0; i < n; ++i) {
        if (i % 16 == 0) absl::SleepFor(absl::Microseconds(jitter_us(rng)));
        if (auto s = me.Collective(); !s.ok()) return Fail(s);
      }
      if (phase == 0) absl::SleepFor(absl::Milliseconds(gap_ms));  // compute, nothing pending
    }
    Say("DONE");
    return 0;
  }
  for (int i = 1; i < n; ++i) {
    if (auto s = me.Collective(); !s.ok()) return Fail(s);
  }
  const uint64_t seq = static_cast<uint64_t>(n);
  if (scenario == "lag" && rank == odd) {
    Say("SLEEPING");
    absl::SleepFor(absl::Seconds(120));
    return 1;
  }
  if (scenario == "leave" && rank == odd) {
    buf->reset();
    group->reset();
    client->reset();
    Say("LEFT");
    absl::SleepFor(absl::Seconds(120));
    return 1;
  }
  if (scenario == "dead" && rank == odd) {
    Say("VICTIM");
    absl::SleepFor(absl::Seconds(120));
    return 1;
  }
  if (scenario == "mismatch" && rank == odd) {
    me.Enter(commd::CollectiveOp::kAllGather);
  } else {
    commd::RecordId id = me.Enter();
    if (scenario == "stuck" && rank != odd) {
      // Every rank has entered seq N before any completes it: a real barrier first.
      if (auto s = me.Barrier(seq); !s.ok()) return Fail(s);
      (*group)->recorder().Completed(id);
    } else if (scenario == "stuck") {
      if (auto s = me.Barrier(seq); !s.ok()) return Fail(s);
    }
  }
  return me.WaitForAbort(seq,
                         /*silent=*/(scenario == "silent" || scenario == "stuck") && rank == odd);
}
