// Cost of recording one collective (Begin + Started + Completed) in the control block's
// lock-free ring, next to a mutex-protected in-process ring as the baseline, with the same
// clock in each pair of rows.
//
//   recorder_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Clocks: fake (a counter: the ring's own cost), tsc (NewTscRecorderClock, the SDK's
// default), realtime (clock_gettime per call).
#include <benchmark/benchmark.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/recorder/ring_test_util.h"

namespace commd {
namespace {

enum ClockKind { kFake = 0, kTsc = 1, kRealtime = 2 };

std::unique_ptr<RecorderClock> MakeClock(int kind) {
  switch (kind) {
    case kTsc:
      return NewTscRecorderClock();
    case kRealtime:
      return NewRealtimeRecorderClock();
    default:
      return std::make_unique<testing::FakeClock>();
  }
}

const char* ClockName(int kind) {
  return kind == kTsc ? "tsc" : kind == kRealtime ? "realtime" : "fake";
}

void BM_LockFreeRing(benchmark::State& state) {
  testing::TestBlock block(uint32_t(state.range(1)));
  auto w = RingWriter::Attach(
      block.base(), block.bytes,
      {.pg_name = "0", .pg_desc = "default_pg", .clock = MakeClock(int(state.range(0)))});
  const int64_t count = 1 << 20;
  const TensorDesc t{.dims = &count, .ndim = 1, .dtype = DataType::kBFloat16};
  const RecordArgs args{
      .op = CollectiveOp::kAllReduce, .inputs = {&t, 1}, .outputs = {&t, 1}, .timeout_ms = 600000};
  for (auto _ : state) {
    RecordHandle h = (*w)->Begin(args);
    (*w)->Started(h);
    (*w)->Completed(h);
    benchmark::DoNotOptimize(h);
  }
  state.SetLabel(ClockName(int(state.range(0))));
}
// Second argument: ring capacity (2048 entries, 1.7 MB, spill out of L2; 64 stay in it).
BENCHMARK(BM_LockFreeRing)
    ->ArgNames({"clock", "capacity"})
    ->Args({kFake, 2048})
    ->Args({kTsc, 2048})
    ->Args({kRealtime, 2048})
    ->Args({kFake, 64})
    ->Args({kTsc, 64});

// The host backend's path: the collective starts when called, so one clock read fewer.
void BM_LockFreeRingBeginStarted(benchmark::State& state) {
  testing::TestBlock block(2048);
  auto w = RingWriter::Attach(
      block.base(), block.bytes,
      {.pg_name = "0", .pg_desc = "default_pg", .clock = MakeClock(int(state.range(0)))});
  const int64_t count = 1 << 20;
  const TensorDesc t{.dims = &count, .ndim = 1, .dtype = DataType::kBFloat16};
  const RecordArgs args{
      .op = CollectiveOp::kAllReduce, .inputs = {&t, 1}, .outputs = {&t, 1}, .timeout_ms = 600000};
  for (auto _ : state) {
    RecordHandle h = (*w)->BeginStarted(args);
    (*w)->Completed(h);
    benchmark::DoNotOptimize(h);
  }
  state.SetLabel(ClockName(int(state.range(0))));
}
BENCHMARK(BM_LockFreeRingBeginStarted)->Arg(kFake)->Arg(kTsc)->Arg(kRealtime);

// The baseline: what an in-process recorder does (PyTorch's holds a mutex around a vector of
// entries). Fixed-size entries, preallocated, so the difference is the lock, not malloc.
struct MutexEntry {
  uint64_t id, seq, time_created, time_started, time_completed, timeout_ms;
  int op, state;
  char pg_name[64];
  int64_t input_dims[8][4], output_dims[8][4];
};

class MutexRing {
 public:
  MutexRing(size_t capacity, std::unique_ptr<RecorderClock> clock)
      : entries_(capacity), clock_(std::move(clock)) {}
  uint64_t Begin(int op, int64_t count, uint64_t timeout_ms) {
    const uint64_t now = clock_->NowNs();
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_++;
    MutexEntry& e = entries_[id % entries_.size()];
    e = MutexEntry{
        .id = id, .seq = ++seq_, .time_created = now, .timeout_ms = timeout_ms, .op = op};
    std::memcpy(e.pg_name, "0", 2);
    e.input_dims[0][0] = e.output_dims[0][0] = count;
    return id;
  }
  void Transition(uint64_t id, int new_state) {
    const uint64_t now = clock_->NowNs();
    std::lock_guard<std::mutex> lock(mu_);
    MutexEntry& e = entries_[id % entries_.size()];
    if (e.id != id) return;
    e.state = new_state;
    (new_state == 1 ? e.time_started : e.time_completed) = now;
  }

 private:
  std::mutex mu_;
  std::vector<MutexEntry> entries_;
  uint64_t next_ = 0, seq_ = 0;
  std::unique_ptr<RecorderClock> clock_;
};

void BM_MutexRing(benchmark::State& state) {
  MutexRing ring(size_t(state.range(1)), MakeClock(int(state.range(0))));
  for (auto _ : state) {
    const uint64_t id = ring.Begin(0, 1 << 20, 600000);
    ring.Transition(id, 1);
    ring.Transition(id, 2);
    benchmark::DoNotOptimize(id);
  }
  state.SetLabel(ClockName(int(state.range(0))));
}
BENCHMARK(BM_MutexRing)
    ->ArgNames({"clock", "capacity"})
    ->Args({kFake, 2048})
    ->Args({kTsc, 2048})
    ->Args({kRealtime, 2048})
    ->Args({kFake, 64})
    ->Args({kTsc, 64});

// A baseline closer to PyTorch's entries: strings and vectors, allocated per record.
struct DequeEntry {
  uint64_t id, time_created, time_started = 0, time_completed = 0;
  std::string profiling_name, pg_name;
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  int state = 0;
};

void BM_MutexDequeAllocating(benchmark::State& state) {
  std::mutex mu;
  std::deque<DequeEntry> ring;
  auto clock = MakeClock(int(state.range(0)));
  uint64_t next = 0;
  for (auto _ : state) {
    uint64_t id;
    {
      const uint64_t now = clock->NowNs();
      std::lock_guard<std::mutex> lock(mu);
      id = next++;
      if (ring.size() == 2048) ring.pop_front();
      ring.push_back({.id = id,
                      .time_created = now,
                      .profiling_name = "nccl:all_reduce",
                      .pg_name = "0",
                      .input_sizes = {{1 << 20}},
                      .output_sizes = {{1 << 20}}});
    }
    for (int s = 1; s <= 2; ++s) {
      const uint64_t now = clock->NowNs();
      std::lock_guard<std::mutex> lock(mu);
      DequeEntry& e = ring.back();
      e.state = s;
      (s == 1 ? e.time_started : e.time_completed) = now;
    }
    benchmark::DoNotOptimize(id);
  }
  state.SetLabel(ClockName(int(state.range(0))));
}
BENCHMARK(BM_MutexDequeAllocating)->Arg(kFake)->Arg(kTsc);

}  // namespace
}  // namespace commd

BENCHMARK_MAIN();
