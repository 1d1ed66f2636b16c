// The flight recorder's clock seam: nanoseconds on the CLOCK_REALTIME scale (what PyTorch's
// recorder writes as time_created_ns, and what the daemon compares heartbeats against).
//
//   std::unique_ptr<RecorderClock> clock = NewTscRecorderClock();  // fast, see below
//   uint64_t now = clock->NowNs();
//
// Tests fake it by implementing RecorderClock. NowNs() never blocks, allocates or enters the
// kernel (clock_gettime is served by the vDSO).
//
// Thread-safety: the realtime clock is thread-safe. The TSC clock is not (it re-anchors
// itself in place); give each RingWriter its own.
#ifndef COMMD_COMMON_CONTROL_BLOCK_CLOCK_H_
#define COMMD_COMMON_CONTROL_BLOCK_CLOCK_H_

#include <cstdint>
#include <memory>

namespace commd {

class RecorderClock {
 public:
  virtual ~RecorderClock() = default;
  virtual uint64_t NowNs() = 0;
};

// clock_gettime(CLOCK_REALTIME): ~20-25 ns a call on a TSC clocksource.
std::unique_ptr<RecorderClock> NewRealtimeRecorderClock();

// rdtsc scaled to CLOCK_REALTIME: ~10 ns a call. Calibrates for ~5 ms when created, then
// re-anchors to CLOCK_REALTIME about once a second (refining its rate over the whole run),
// so it tracks NTP adjustments within microseconds; a re-anchor may step time by that much.
// Falls back to the realtime clock when the CPU lacks an invariant TSC.
std::unique_ptr<RecorderClock> NewTscRecorderClock();

}  // namespace commd

#endif  // COMMD_COMMON_CONTROL_BLOCK_CLOCK_H_
