#include "kernels/host/barrier.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/signal_layout.h"

namespace commd::kernels {
namespace {

// How a wait escalates. A peer on another core usually arrives within microseconds, but a
// two-shot's reduce phase keeps it busy for tens of microseconds at 1 MiB, and on a loaded
// machine a futex wake-up costs more than that: so spin (pause) for up to kSpinTime while
// every rank can have a core of its own, then yield the CPU for up to kYieldTime (cheap when
// ranks outnumber cores: a runnable peer gets the core at once), and only then sleep on the
// futex, where a wait for a slow peer burns no CPU.
constexpr absl::Duration kSpinTime = absl::Microseconds(50);
constexpr absl::Duration kYieldTime = absl::Microseconds(500);
constexpr int kSpinCheckEvery = 64;  // pause iterations between clock reads
// Longest single futex sleep: bounds how late an abort (which nobody futex-wakes us for) is
// noticed.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(2);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Shared (not FUTEX_PRIVATE) operations: the pads are MAP_SHARED between processes.
void FutexWait(uint32_t* addr, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);  // EAGAIN/EINTR/ETIMEDOUT ok
}
void FutexWakeAll(uint32_t* addr) {
  syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

uint32_t AbortValue(const HostCommView& view) {
  if (view.abort_word == nullptr) return 0;
  return __atomic_load_n(view.abort_word, __ATOMIC_ACQUIRE);
}

// Online CPUs, read once: spinning only pays while every rank can run at the same time.
int OnlineCpus() {
  static const int cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return cpus;
}

}  // namespace

std::atomic_ref<uint32_t> HostBarrierRound::Slot(int peer) const {
  return std::atomic_ref<uint32_t>(
      view_.pads[view_.rank][PadSlot(kHostBarrierChannel, peer, view_.world_size)]);
}

std::atomic_ref<uint32_t> HostBarrierRound::SleepFlag() const {
  return std::atomic_ref<uint32_t>(
      view_.pads[view_.rank][PadSlot(kHostSleepChannel, view_.rank, view_.world_size)]);
}

absl::Status HostBarrierRound::WaitFor(int peer) {
  std::atomic_ref<uint32_t> slot = Slot(peer);
  const bool spin = view_.world_size <= OnlineCpus();
  // A peer that is a few hundred nanoseconds behind arrives within these spins: no clock.
  for (int i = 0; i < (spin ? kSpinCheckEvery : 1); ++i) {
    if (Reached(slot.load(std::memory_order_acquire), target_)) return absl::OkStatus();
    CpuRelax();
  }
  const absl::Time start = absl::Now();
  if (deadline_ == absl::InfinitePast()) {
    deadline_ = std::min(view_.deadline, start + view_.wait_limit);
  }
  if (spin) {
    const absl::Time spin_until = std::min(start + kSpinTime, deadline_);
    for (int i = 1;; ++i) {
      if (Reached(slot.load(std::memory_order_acquire), target_)) return absl::OkStatus();
      CpuRelax();
      if (i % kSpinCheckEvery == 0 && (absl::Now() >= spin_until || AbortValue(view_) != 0)) {
        break;
      }
    }
  }
  const absl::Time yield_until = start + kYieldTime;
  for (;;) {
    if (AbortValue(view_) != 0) return Failure(peer, true);
    const absl::Time now = absl::Now();
    if (now >= deadline_) return Failure(peer, false);
    if (now < yield_until) {
      sched_yield();
      if (Reached(slot.load(std::memory_order_acquire), target_)) return absl::OkStatus();
      continue;
    }
    // Dekker handshake with Arrive(): flag store then slot load here, slot store then flag
    // load there, all seq_cst, so either we see the arrival or the arriver sees the flag.
    if (!sleeping_) {
      SleepFlag().store(1, std::memory_order_seq_cst);
      sleeping_ = true;
    }
    const uint32_t seen = slot.load(std::memory_order_seq_cst);
    if (Reached(seen, target_)) return absl::OkStatus();
    if (view_.heartbeat_ns != nullptr && now - last_beat_ >= kHeartbeatPeriod) {
      __atomic_store_n(view_.heartbeat_ns, static_cast<uint64_t>(absl::ToUnixNanos(now)),
                       __ATOMIC_RELAXED);
      last_beat_ = now;
    }
    FutexWait(&view_.pads[view_.rank][PadSlot(kHostBarrierChannel, peer, view_.world_size)], seen,
              std::min(kMaxSleep, deadline_ - now));
    if (Reached(slot.load(std::memory_order_acquire), target_)) return absl::OkStatus();
  }
}

absl::Status HostBarrierRound::Failure(int peer, bool aborted) const {
  std::vector<int> missing;
  for (int p = 0; p < view_.world_size; ++p) {
    if (p != view_.rank && !Reached(Slot(p).load(std::memory_order_acquire), target_)) {
      missing.push_back(p);
    }
  }
  if (missing.empty()) missing.push_back(peer);
  const std::string where = absl::StrCat(
      collective_, " on rank ", view_.rank, " of ", view_.world_size, " waiting for rank ", peer,
      " (ranks not arrived: [", absl::StrJoin(missing, ", "), "], barrier #", target_, ")");
  // The kernels see only the abort word; the SDK puts the daemon's words for it in front.
  if (aborted) return absl::AbortedError(absl::StrCat(where, ": the daemon aborted the group"));
  return absl::DeadlineExceededError(absl::StrCat(where, ": deadline exceeded"));
}

namespace {

// Publishes this rank's arrival at barrier `seq` to every peer and wakes sleeping ones.
void Arrive(const HostCommView& view, uint32_t seq) {
  const int w = view.world_size;
  for (int p = 0; p < w; ++p) {
    if (p == view.rank) continue;
    std::atomic_ref<uint32_t>(view.pads[p][PadSlot(kHostBarrierChannel, view.rank, w)])
        .store(seq, std::memory_order_seq_cst);
  }
  for (int p = 0; p < w; ++p) {
    if (p == view.rank) continue;
    const uint32_t sleeping =
        std::atomic_ref<uint32_t>(view.pads[p][PadSlot(kHostSleepChannel, p, w)])
            .load(std::memory_order_seq_cst);
    if (sleeping != 0) FutexWakeAll(&view.pads[p][PadSlot(kHostBarrierChannel, view.rank, w)]);
  }
}

}  // namespace

absl::Status CheckNotAborted(const HostCommView& view, absl::string_view collective) {
  if (AbortValue(view) != 0) {
    return absl::AbortedError(
        absl::StrCat(collective, " on rank ", view.rank, ": the daemon aborted the group"));
  }
  return absl::OkStatus();
}

HostBarrierRound::HostBarrierRound(const HostCommView& view, absl::string_view collective)
    : view_(view), collective_(collective) {
  std::atomic_ref<uint32_t> own(Slot(view.rank));
  target_ = own.load(std::memory_order_relaxed) + 1;
  own.store(target_, std::memory_order_relaxed);
  Arrive(view, target_);
}

HostBarrierRound::~HostBarrierRound() {
  if (sleeping_) SleepFlag().store(0, std::memory_order_relaxed);
}

absl::Status HostBarrierRound::WaitForAll() {
  // Starting after our own rank spreads the first waits of different ranks over different
  // slots; the order does not matter for correctness.
  for (int i = 1; i < view_.world_size; ++i) {
    RETURN_IF_ERROR(WaitFor((view_.rank + i) % view_.world_size));
  }
  return absl::OkStatus();
}

absl::Status HostBarrier(const HostCommView& view, absl::string_view collective) {
  if (view.world_size == 1) return CheckNotAborted(view, collective);
  return HostBarrierRound(view, collective).WaitForAll();
}

}  // namespace commd::kernels
