#include "kernels/host/barrier.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
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

// Rank `owner`'s sleeping flag (kernels/signal_layout.h).
uint32_t* SleepFlag(const HostCommView& view, int owner) {
  return reinterpret_cast<uint32_t*>(reinterpret_cast<std::byte*>(view.pads[owner]) +
                                     ExchangeAreaOffset(view.world_size));
}

}  // namespace

int OnlineCpus() {
  static const int cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return cpus;
}

HostWait::~HostWait() {
  if (sleeping_)
    std::atomic_ref<uint32_t>(*SleepFlag(view_, view_.rank)).store(0, std::memory_order_relaxed);
}

HostWait::Result HostWait::Until(uint32_t* word, uint32_t target) {
  std::atomic_ref<uint32_t> slot(*word);
  const bool spin = view_.world_size <= OnlineCpus();
  // A peer that is a few hundred nanoseconds behind arrives within these spins: no clock.
  for (int i = 0; i < (spin ? kSpinCheckEvery : 1); ++i) {
    if (Reached(slot.load(std::memory_order_acquire), target)) return Result::kReached;
    CpuRelax();
  }
  const absl::Time start = absl::Now();
  if (deadline_ == absl::InfinitePast()) {
    deadline_ = std::min(view_.deadline, start + view_.wait_limit);
  }
  if (spin) {
    const absl::Time spin_until = std::min(start + kSpinTime, deadline_);
    for (int i = 1;; ++i) {
      if (Reached(slot.load(std::memory_order_acquire), target)) return Result::kReached;
      CpuRelax();
      if (i % kSpinCheckEvery == 0 && (absl::Now() >= spin_until || AbortValue(view_) != 0)) {
        break;
      }
    }
  }
  const absl::Time yield_until = start + kYieldTime;
  // A word that reached its target counts even when the abort or the deadline is seen first:
  // a peer that arrived and then aborted the group (or finished and went on to abort it) has
  // done its part for this wait. The abort word's acquire load makes every store its writer
  // made before it visible, so the load after it sees such an arrival.
  auto ended = [&](Result why) {
    return Reached(slot.load(std::memory_order_acquire), target) ? Result::kReached : why;
  };
  for (;;) {
    if (AbortValue(view_) != 0) return ended(Result::kAborted);
    const absl::Time now = absl::Now();
    if (now >= deadline_) return ended(Result::kDeadline);
    if (now < yield_until) {
      sched_yield();
      if (Reached(slot.load(std::memory_order_acquire), target)) return Result::kReached;
      continue;
    }
    // Dekker handshake with Wake(): flag store then word load here, word store then flag
    // load there, all seq_cst, so either we see the word or the writer sees the flag.
    if (!sleeping_) {
      std::atomic_ref<uint32_t>(*SleepFlag(view_, view_.rank)).store(1, std::memory_order_seq_cst);
      sleeping_ = true;
    }
    const uint32_t seen = slot.load(std::memory_order_seq_cst);
    if (Reached(seen, target)) return Result::kReached;
    if (view_.heartbeat_ns != nullptr && now - last_beat_ >= kHeartbeatPeriod) {
      __atomic_store_n(view_.heartbeat_ns, static_cast<uint64_t>(absl::ToUnixNanos(now)),
                       __ATOMIC_RELAXED);
      last_beat_ = now;
    }
    FutexWait(word, seen, std::min(kMaxSleep, deadline_ - now));
    if (Reached(slot.load(std::memory_order_acquire), target)) return Result::kReached;
  }
}

void HostWait::Wake(const HostCommView& view, int owner, uint32_t* word) {
  const uint32_t sleeping =
      std::atomic_ref<uint32_t>(*SleepFlag(view, owner)).load(std::memory_order_seq_cst);
  if (sleeping != 0) FutexWakeAll(word);
}

namespace {

// ABORTED or DEADLINE_EXCEEDED for a wait of `what` (a barrier's, an exchange's) that ended
// without `peer`, naming every rank `arrived` says is missing.
template <typename Arrived>
absl::Status WaitFailure(const HostCommView& view, absl::string_view collective, int peer,
                         HostWait::Result result, absl::string_view what, Arrived arrived) {
  std::vector<int> missing;
  for (int p = 0; p < view.world_size; ++p) {
    if (p != view.rank && !arrived(p)) missing.push_back(p);
  }
  if (missing.empty()) missing.push_back(peer);
  const std::string where = absl::StrCat(
      collective, " on rank ", view.rank, " of ", view.world_size, " waiting for rank ", peer,
      " (ranks not arrived: [", absl::StrJoin(missing, ", "), "], ", what, ")");
  // The kernels see only the abort word; the SDK puts the daemon's words for it in front.
  if (result == HostWait::Result::kAborted) {
    return absl::AbortedError(absl::StrCat(where, ": the daemon aborted the group"));
  }
  return absl::DeadlineExceededError(absl::StrCat(where, ": deadline exceeded"));
}

// Publishes this rank's arrival at barrier `seq` to every peer and wakes sleeping ones.
void Arrive(const HostCommView& view, uint32_t seq) {
  const int w = view.world_size;
  for (int p = 0; p < w; ++p) {
    if (p == view.rank) continue;
    std::atomic_ref<uint32_t>(view.pads[p][PadSlot(kHostBarrierChannel, view.rank, w)])
        .store(seq, std::memory_order_seq_cst);
  }
  for (int p = 0; p < w; ++p) {
    if (p != view.rank) {
      HostWait::Wake(view, p, &view.pads[p][PadSlot(kHostBarrierChannel, view.rank, w)]);
    }
  }
}

}  // namespace

absl::Status HostBarrier(const HostCommView& view, absl::string_view collective) {
  const int w = view.world_size;
  if (w == 1) return CheckNotAborted(view, collective);
  auto slot = [&](int peer) {
    return &view.pads[view.rank][PadSlot(kHostBarrierChannel, peer, w)];
  };
  std::atomic_ref<uint32_t> own(*slot(view.rank));
  const uint32_t target = own.load(std::memory_order_relaxed) + 1;
  own.store(target, std::memory_order_relaxed);
  Arrive(view, target);
  HostWait wait(view);
  // Starting after our own rank spreads the first waits of different ranks over different
  // slots; the order does not matter for correctness.
  for (int i = 1; i < w; ++i) {
    const int peer = (view.rank + i) % w;
    const HostWait::Result r = wait.Until(slot(peer), target);
    if (r == HostWait::Result::kReached) continue;
    return WaitFailure(view, collective, peer, r, absl::StrCat("barrier #", target), [&](int p) {
      return Reached(std::atomic_ref<uint32_t>(*slot(p)).load(std::memory_order_acquire), target);
    });
  }
  return absl::OkStatus();
}

std::byte* HostExchange::Slot(int owner, int source) const {
  return reinterpret_cast<std::byte*>(view_.pads[owner]) + parity_offset_ +
         static_cast<size_t>(source) * slot_bytes_;
}

uint32_t* HostExchange::Flag(int owner, int source) const {
  return reinterpret_cast<uint32_t*>(Slot(owner, source) + kExchangeFlagOffset);
}

HostExchange::HostExchange(const HostCommView& view, absl::string_view collective)
    : view_(view),
      collective_(collective),
      slot_bytes_(ExchangeSlotBytes(view.world_size)),
      wait_(view) {
  std::atomic_ref<uint32_t> own(
      view.pads[view.rank][PadSlot(kHostExchangeChannel, view.rank, view.world_size)]);
  seq_ = own.load(std::memory_order_relaxed) + 1;
  own.store(seq_, std::memory_order_relaxed);
  parity_offset_ = ExchangeSlotsOffset(view.world_size) +
                   (seq_ & 1) * static_cast<size_t>(view.world_size) * slot_bytes_;
}

size_t HostExchange::payload_capacity() const { return slot_bytes_ - kExchangePayloadOffset; }

size_t HostExchange::PayloadCapacity(int world_size) {
  return ExchangeSlotBytes(world_size) - kExchangePayloadOffset;
}

void HostExchange::Send(const CallWords& words, size_t payload_bytes) {
  const uint32_t w[4] = {words.call, words.nan_count, words.count, words.shape};
  std::memcpy(Slot(view_.rank, view_.rank) + kExchangeWordsOffset, w, sizeof(w));
  std::atomic_ref<uint32_t>(*Flag(view_.rank, view_.rank)).store(seq_, std::memory_order_relaxed);
  // Each peer's copy: the words and payload, then the flag that says they are there.
  const std::byte* own = Slot(view_.rank, view_.rank) + kExchangeWordsOffset;
  const size_t bytes = kExchangePayloadOffset - kExchangeWordsOffset + payload_bytes;
  for (int p = 0; p < view_.world_size; ++p) {
    if (p == view_.rank) continue;
    std::memcpy(Slot(p, view_.rank) + kExchangeWordsOffset, own, bytes);
    std::atomic_ref<uint32_t>(*Flag(p, view_.rank)).store(seq_, std::memory_order_seq_cst);
  }
  for (int p = 0; p < view_.world_size; ++p) {
    if (p != view_.rank) HostWait::Wake(view_, p, Flag(p, view_.rank));
  }
}

absl::Status HostExchange::WaitFor(int peer) {
  const HostWait::Result r = wait_.Until(Flag(view_.rank, peer), seq_);
  if (r == HostWait::Result::kReached) return absl::OkStatus();
  return WaitFailure(view_, collective_, peer, r, absl::StrCat("exchange #", seq_), [&](int p) {
    return Reached(std::atomic_ref<uint32_t>(*Flag(view_.rank, p)).load(std::memory_order_acquire),
                   seq_);
  });
}

absl::Status HostExchange::WaitForAll() {
  for (int i = 1; i < view_.world_size; ++i) {
    RETURN_IF_ERROR(WaitFor((view_.rank + i) % view_.world_size));
  }
  return absl::OkStatus();
}

CallWords HostExchange::words(int rank) const {
  uint32_t w[4];
  std::memcpy(w, Slot(view_.rank, rank) + kExchangeWordsOffset, sizeof(w));
  return CallWords{.call = w[0], .nan_count = w[1], .count = w[2], .shape = w[3]};
}

bool PeerAwaitsNextExchange(const uint32_t* own_pad, int rank, int world_size, int peer) {
  const uint32_t next =
      std::atomic_ref<uint32_t>(
          const_cast<uint32_t&>(own_pad[PadSlot(kHostExchangeChannel, rank, world_size)]))
          .load(std::memory_order_relaxed) +
      1;
  const size_t slot_bytes = ExchangeSlotBytes(world_size);
  const size_t offset = ExchangeSlotsOffset(world_size) +
                        (next & 1) * static_cast<size_t>(world_size) * slot_bytes +
                        static_cast<size_t>(peer) * slot_bytes + kExchangeFlagOffset;
  const auto* flag =
      reinterpret_cast<const uint32_t*>(reinterpret_cast<const std::byte*>(own_pad) + offset);
  return Reached(
      std::atomic_ref<uint32_t>(const_cast<uint32_t&>(*flag)).load(std::memory_order_acquire),
      next);
}

absl::Status CheckNotAborted(const HostCommView& view, absl::string_view collective) {
  if (AbortValue(view) != 0) {
    return absl::AbortedError(
        absl::StrCat(collective, " on rank ", view.rank, ": the daemon aborted the group"));
  }
  return absl::OkStatus();
}

}  // namespace commd::kernels
