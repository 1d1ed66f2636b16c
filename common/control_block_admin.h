// Daemon-side operations on a control block: initialize fresh memory, raise the abort word.
//
//   size_t bytes = ControlBlockBytes(2048);
//   // ... memfd_create, ftruncate(bytes), F_SEAL_SHRINK|F_SEAL_GROW, mmap ...
//   RETURN_IF_ERROR(InitControlBlock(base, bytes, {.ring_capacity = 2048, .rank = 0,
//                                                  .world_size = 8, .global_rank = 0}));
//   RequestAbort(base, bytes, AbortReason::kStuck, "allreduce seq 42 stuck on rank 3", now);
//
// Seal the memfd against shrinking before handing it to a client: a client that truncates
// the file would otherwise make the daemon's reads fault (SIGBUS), whatever the reader checks.
//
// Thread-safety: InitControlBlock must run before the block is shared. RequestAbort may be
// called from any daemon thread; the first reason wins.
#ifndef COMMD_COMMON_CONTROL_BLOCK_ADMIN_H_
#define COMMD_COMMON_CONTROL_BLOCK_ADMIN_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "common/control_block.h"

namespace commd {

struct ControlBlockParams {
  uint32_t ring_capacity = 2048;  // power of two in [1, kRingMaxCapacity]
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t global_rank = 0;
  uint64_t created_ns = 0;  // CLOCK_REALTIME; 0: now
  // The memory is known to be zero (fresh memfd pages): only the header is written, so the
  // pages nobody uses are never faulted in (the daemon's RSS does not grow per member).
  bool memory_is_zero = false;
};

// Zeroes `mapped_bytes` at `base` (64-byte aligned, at least ControlBlockBytes(capacity)),
// unless params.memory_is_zero, and writes the header. INVALID_ARGUMENT names the bad parameter.
absl::Status InitControlBlock(void* base, size_t mapped_bytes, const ControlBlockParams& params);

// Sets the abort word once: text and time first, then the reason (release), then wakes futex
// waiters on the word. Returns false when a reason was already set (it is kept) or when the
// mapping is too small to hold the fixed part. `reason` must not be kNone.
bool RequestAbort(void* base, size_t mapped_bytes, AbortReason reason, std::string_view text,
                  uint64_t now_ns);

}  // namespace commd

#endif  // COMMD_COMMON_CONTROL_BLOCK_ADMIN_H_
