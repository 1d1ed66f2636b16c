#include "common/control_block_admin.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/control_block_atomic.h"

namespace commd {
namespace {

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

}  // namespace

absl::Status InitControlBlock(void* base, size_t mapped_bytes, const ControlBlockParams& p) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 64 != 0) {
    return absl::InvalidArgumentError("control block base must be non-null and 64-byte aligned");
  }
  if (!IsValidRingCapacity(p.ring_capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("ring capacity ", p.ring_capacity,
                                                   " is not a power of two in [", kRingMinCapacity,
                                                   ", ", kRingMaxCapacity, "]"));
  }
  const size_t need = ControlBlockBytes(p.ring_capacity);
  if (mapped_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("mapping of ", mapped_bytes,
                                                   " bytes is smaller than the ", need,
                                                   " a ring of ", p.ring_capacity, " needs"));
  }
  if (p.world_size < 1 || p.world_size > kControlBlockMaxWorldSize || p.rank < 0 ||
      p.rank >= p.world_size || p.global_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", p.rank, " / world size ", p.world_size, " / global rank ", p.global_rank,
        " is not 0 <= rank < world size <= ", kControlBlockMaxWorldSize, ", global rank >= 0"));
  }
  if (!p.memory_is_zero) std::memset(base, 0, mapped_bytes);
  auto* h = static_cast<ControlBlockHeader*>(base);
  h->magic = kControlBlockMagic;
  h->abi_version = kControlBlockAbiVersion;
  h->header_bytes = sizeof(ControlBlockHeader);
  h->total_bytes = need;
  h->ring_capacity = p.ring_capacity;
  h->entry_bytes = sizeof(RingEntry);
  h->rank = p.rank;
  h->world_size = p.world_size;
  h->global_rank = p.global_rank;
  h->discovery_slot_bytes = sizeof(DiscoverySlot);
  h->progress_offset = kProgressOffset;
  h->ring_state_offset = kRingStateOffset;
  h->counters_offset = kCountersOffset;
  h->abort_offset = kAbortOffset;
  h->ring_offset = kRingOffset;
  h->discovery_offset = DiscoveryOffset(p.ring_capacity);
  h->created_ns = p.created_ns != 0 ? p.created_ns : RealtimeNs();
  std::atomic_thread_fence(std::memory_order_release);
  return absl::OkStatus();
}

bool RequestAbort(void* base, size_t mapped_bytes, AbortReason reason, std::string_view text,
                  uint64_t now_ns) {
  if (base == nullptr || mapped_bytes < kRingOffset || reason == AbortReason::kNone) return false;
  auto* a = reinterpret_cast<ControlBlockAbort*>(static_cast<char*>(base) + kAbortOffset);
  // One daemon-wide lock: aborts are rare, and it keeps two daemon threads from both writing
  // the text. The client only ever reads these words.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (cb_atomic::LoadAcquire(&a->reason) != 0) return false;
  char buf[kAbortTextBytes] = {};
  std::memcpy(buf, text.data(), std::min(text.size(), sizeof(buf) - 1));
  // Byte stores through atomics: the client may read the text while we write it.
  for (size_t i = 0; i < sizeof(buf); ++i) cb_atomic::StoreRelaxed(&a->text[i], buf[i]);
  cb_atomic::StoreRelaxed(&a->time_ns, now_ns);
  cb_atomic::StoreRelease(&a->reason, static_cast<uint32_t>(reason));
  // Shared futex (not FUTEX_PRIVATE): the waiters are in other processes.
  syscall(SYS_futex, &a->reason, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  return true;
}

}  // namespace commd
