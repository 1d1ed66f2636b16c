// Test support: an aligned, initialized control block in process memory, a fake clock, and
// a writer that records a recognizable mix of entries. Used by the recorder tests, the
// seed-corpus generator and the benchmark.
#ifndef COMMD_DAEMON_RECORDER_RING_TEST_UTIL_H_
#define COMMD_DAEMON_RECORDER_RING_TEST_UTIL_H_

#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/control_block.h"
#include "common/control_block_admin.h"
#include "common/control_block_writer.h"

namespace commd::testing {

class FakeClock : public RecorderClock {
 public:
  explicit FakeClock(uint64_t start = 1'000'000, uint64_t step = 1000) : now_(start), step_(step) {}
  uint64_t NowNs() override { return now_ += step_; }

 private:
  uint64_t now_;
  uint64_t step_;
};

struct TestBlock {
  explicit TestBlock(uint32_t capacity, int32_t rank = 0, int32_t world_size = 2,
                     int32_t global_rank = 0)
      : bytes(ControlBlockBytes(capacity)) {
    mem.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    ok = InitControlBlock(mem.get(), bytes,
                          {.ring_capacity = capacity,
                           .rank = rank,
                           .world_size = world_size,
                           .global_rank = global_rank,
                           .created_ns = 42})
             .ok();
  }
  char* base() { return mem.get(); }
  RingEntry* entry(uint32_t slot) {
    return reinterpret_cast<RingEntry*>(mem.get() + kRingOffset) + slot;
  }
  std::unique_ptr<RingWriter> Writer(uint64_t clock_start = 1'000'000) {
    auto w = RingWriter::Attach(mem.get(), bytes,
                                {.pg_id = 0,
                                 .pg_name = "0",
                                 .pg_desc = "default_pg",
                                 .clock = std::make_unique<FakeClock>(clock_start)});
    return w.ok() ? std::move(w).value() : nullptr;
  }
  size_t bytes;
  bool ok = false;
  std::unique_ptr<char, decltype(&std::free)> mem{nullptr, &std::free};
};

// Records `n` entries cycling through all-reduce (completed), all-gather (started),
// send / recv (scheduled) and a reduce-scatter with a NaN hit. Sizes derive from the index.
inline void RecordMix(RingWriter& w, int n, int32_t world_size = 2) {
  for (int i = 0; i < n; ++i) {
    const int64_t count = 16 * (i + 1);
    const int64_t gathered = count * world_size;
    const TensorDesc in{.dims = &count, .ndim = 1, .dtype = DataType::kFloat32};
    const TensorDesc out{.dims = &gathered, .ndim = 1, .dtype = DataType::kFloat32};
    switch (i % 5) {
      case 0: {
        RecordHandle h = w.Begin({.op = CollectiveOp::kAllReduce,
                                  .inputs = {&in, 1},
                                  .outputs = {&in, 1},
                                  .timeout_ms = 600000});
        w.Started(h);
        w.Completed(h);
        break;
      }
      case 1:
        w.Started(w.Begin({.op = CollectiveOp::kAllGather,
                           .inputs = {&in, 1},
                           .outputs = {&out, 1},
                           .timeout_ms = 600000}));
        break;
      case 2:
        w.Begin({.op = CollectiveOp::kSend, .inputs = {&in, 1}, .peer = 1 % world_size});
        break;
      case 3:
        w.Begin({.op = CollectiveOp::kRecv, .outputs = {&in, 1}, .peer = 1 % world_size});
        break;
      default: {
        RecordHandle h = w.Begin({.op = CollectiveOp::kReduceScatter,
                                  .inputs = {&out, 1},
                                  .outputs = {&in, 1},
                                  .timeout_ms = 1000});
        w.NanChecked(h, true);
        w.Abandon(h);
        break;
      }
    }
  }
}

}  // namespace commd::testing

#endif  // COMMD_DAEMON_RECORDER_RING_TEST_UTIL_H_
