// How the collectives use the signal pad at the start of every rank's symmetric allocation
// (common/symmetric_layout.h: kSignalPadChannels channels x world_size uint32 slots, slot
// index channel * world_size + peer). Shared by the CPU and CUDA implementations.
//
// Barrier protocol (CPU: channel 0; CUDA: one channel per thread block, block b on channel b):
//   - Slot (c, p) of rank r's pad, p != r, holds the number of barriers on channel c that
//     rank p has arrived at. Only rank p writes it (release store, into r's pad), only rank r
//     waits on it (acquire load, spin then futex on the CPU).
//   - Slot (c, r) of rank r's own pad is r's private count of barriers passed on channel c;
//     no other rank writes it. A barrier increments it to s, stores s into slot (c, r) of
//     every peer's pad, then waits until each own slot (c, p) reaches s.
//   - Values only grow (modulo 2^32; compared by signed difference), so a peer that runs
//     ahead into the next barrier (at most one ahead: it cannot pass a barrier without us)
//     never makes us miss one, and back-to-back collectives need no reset.
//   - The CPU path keeps rank r's "sleeping" flag in the first line of its exchange area
//     (common/symmetric_layout.h), alone in its line so that the peers' reads of it stay in
//     their caches: nonzero while r may be blocked in FUTEX_WAIT on its pad or exchange area,
//     so arriving peers issue FUTEX_WAKE only when someone sleeps.
//
// Exchange (CPU path; common/symmetric_layout.h sizes the area): every collective with data
// (not Barrier) starts with one exchange instead of a barrier. Slot (1, r) of rank r's own pad
// is r's private count of exchanges on the allocation; exchange e uses parity e % 2. Rank r
// writes its message into slot (e % 2, r) of every rank's exchange area, its own included:
//   - bytes 0-3, the flag: e, stored last (seq_cst), then the reader's sleeping flag read and
//     its futex woken on the flag as the barrier does;
//   - bytes 4-19, the call words: the call word (a 31-bit hash of the call's kind, op,
//     algorithm, root (broadcast), number of tensors, each tensor's count and dtype and where
//     they are staged, shifted left by one, bit 0 set when this rank's input had NaN/Inf),
//     the NaN/Inf count (saturated), the first tensor's count (saturated), and the shape word
//     (kind | op << 4 | algorithm << 8 | dtype of the first tensor << 12 | number of tensors
//     (saturated to 2^16 - 1) << 16; a broadcast has its root there);
//   - from byte 32, the payload: a small one-shot all-reduce's inputs (each tensor at a
//     16-byte boundary), so that the exchange is the whole synchronisation of the call.
// A rank waits until the flag of slot (e % 2, p) of its own area reaches e for every peer p,
// then reads the messages in its own memory. Every rank compares every rank's call word with
// rank 0's: ranks whose hash differs make every rank fail with INVALID_ARGUMENT (the same
// verdict everywhere, described from the other words); the NaN bits give the group-wide NaN
// finding. No reset and no closing barrier: rank r writes parity e % 2 again at exchange e + 2,
// which it starts only after exchange e + 1 brought every peer's message, which each peer
// sends only after it has read everything of exchange e.
// A fresh allocation is zero-filled, which is the initial state of every slot. After a
// collective failed (abort, deadline) the counts of the ranks disagree: the allocation can no
// longer be used for collectives.
#ifndef COMMD_KERNELS_SIGNAL_LAYOUT_H_
#define COMMD_KERNELS_SIGNAL_LAYOUT_H_

#include <cstddef>

#include "kernels/host_device.h"

namespace commd::kernels {

inline constexpr int kHostBarrierChannel = 0;
inline constexpr int kHostExchangeChannel = 1;  // own slot: exchanges taken on the allocation

// Byte offsets in an exchange slot.
inline constexpr size_t kExchangeFlagOffset = 0;
inline constexpr size_t kExchangeWordsOffset = 4;     // call, NaN count, count, shape (uint32)
inline constexpr size_t kExchangePayloadOffset = 32;  // to the end of the slot

COMMD_HOST_DEVICE constexpr size_t PadSlot(int channel, int peer, int world_size) {
  return static_cast<size_t>(channel) * static_cast<size_t>(world_size) + static_cast<size_t>(peer);
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_SIGNAL_LAYOUT_H_
