#include "common/control_block_clock.h"

#include <ctime>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace commd {
namespace {

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

class RealtimeClock final : public RecorderClock {
 public:
  uint64_t NowNs() override { return RealtimeNs(); }
};

#if defined(__x86_64__)
bool HasInvariantTsc() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000007u) return false;
  __get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx);
  return (edx & (1u << 8)) != 0;
}

class TscClock final : public RecorderClock {
 public:
  TscClock() {
    Sample(&first_tsc_, &first_ns_);
    uint64_t tsc, ns;
    do {
      Sample(&tsc, &ns);
    } while (ns - first_ns_ < 5'000'000);
    SetRate(tsc - first_tsc_, ns - first_ns_);
    anchor_tsc_ = tsc;
    anchor_ns_ = ns;
  }

  uint64_t NowNs() override {
    uint64_t delta = __rdtsc() - anchor_tsc_;
    // Also taken when the TSC reads behind the anchor (delta wraps): re-anchoring is safe.
    if (delta > reanchor_cycles_) [[unlikely]] {
      Reanchor();
      delta = 0;
    }
    // Never behind an earlier reading: a re-anchor corrects the extrapolated time toward
    // CLOCK_REALTIME, backwards when the rate was estimated high, and an entry's completed
    // time must not precede its started time.
    const uint64_t now = anchor_ns_ + uint64_t((unsigned __int128)delta * mult_ >> 32);
    if (now > last_ns_) last_ns_ = now;
    return last_ns_;
  }

 private:
  // A (tsc, realtime) pair, the tsc taken as the midpoint around clock_gettime: the
  // tightest of a few tries, since a preemption inside one (common on a loaded machine)
  // skews the rate calibrated over 5 ms by up to tens of percent.
  static void Sample(uint64_t* tsc, uint64_t* ns) {
    uint64_t best = ~uint64_t{0};
    *tsc = *ns = 0;
    for (int i = 0; i < 8; ++i) {
      const uint64_t t0 = __rdtsc();
      const uint64_t n = RealtimeNs();
      const uint64_t t1 = __rdtsc();
      if (t1 - t0 < best) {
        best = t1 - t0;
        *tsc = t0 + (t1 - t0) / 2;
        *ns = n;
      }
    }
  }

  void SetRate(uint64_t cycles, uint64_t ns) {
    if (cycles == 0) cycles = 1;
    mult_ = uint64_t(((unsigned __int128)ns << 32) / cycles);
    // About one second of cycles between re-anchors.
    reanchor_cycles_ = uint64_t((unsigned __int128)cycles * 1'000'000'000u / (ns ? ns : 1));
  }

  void Reanchor() {
    uint64_t tsc, ns;
    Sample(&tsc, &ns);
    if (tsc > first_tsc_ && ns > first_ns_) SetRate(tsc - first_tsc_, ns - first_ns_);
    anchor_tsc_ = tsc;
    anchor_ns_ = ns;
  }

  uint64_t first_tsc_ = 0, first_ns_ = 0;
  uint64_t anchor_tsc_ = 0, anchor_ns_ = 0;
  uint64_t mult_ = 0;  // ns per cycle, 32.32 fixed point
  uint64_t reanchor_cycles_ = 0;
  uint64_t last_ns_ = 0;  // the latest value returned
};
#endif

}  // namespace

std::unique_ptr<RecorderClock> NewRealtimeRecorderClock() {
  return std::make_unique<RealtimeClock>();
}

std::unique_ptr<RecorderClock> NewTscRecorderClock() {
#if defined(__x86_64__)
  if (HasInvariantTsc()) return std::make_unique<TscClock>();
#endif
  return NewRealtimeRecorderClock();
}

}  // namespace commd
