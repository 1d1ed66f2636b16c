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
//   - The CPU path also uses slot (1, r) of rank r's own pad as a "sleeping" flag: nonzero
//     while r may be blocked in FUTEX_WAIT on its pad, so arriving peers issue FUTEX_WAKE
//     only when someone sleeps.
//
// Call check (CPU path, channels 2 to 5): every collective with data (not Barrier) writes, in
// ITS OWN pad only, slot (c, r) of channels 2 to 5 (relaxed stores) before its staging
// barrier, and after that barrier reads slot (c, p) of every peer p's pad:
//   - channel 2, the call word: a 31-bit hash of the call's kind, op, algorithm, root
//     (broadcast), number of tensors and each tensor's count and dtype, shifted left by one, with
//     bit 0 set when this rank's input had NaN/Inf (only known when it was checked; 0 otherwise).
//     Read on every collective (world_size loads): ranks whose hash differs from rank 0's make
//     every rank fail with INVALID_ARGUMENT, and the bits give the group-wide NaN finding.
//   - channel 3: this rank's NaN/Inf count, saturated to 2^32 - 1 (0 when not checked);
//   - channel 4: the first tensor's count, saturated to 2^32 - 1;
//   - channel 5: kind | op << 4 | algorithm << 8 | dtype of the first tensor << 12 | number
//     of tensors (saturated to 2^16 - 1) << 16; a broadcast (one tensor) has its root there.
//   Channels 3 to 5 are written on every collective but read only when a call word asks
//   (a NaN bit, a mismatch), to describe it. The slots are written every time, so they
//   always describe this rank's latest call.
// Safe without a reset: a peer reads r's slots between the staging barrier and the next
// barrier of the same collective, and r writes them again only after the closing barrier,
// which the reader has not reached before it has read. On a mismatch every rank sees the same
// call words, so every rank runs the same single closing barrier: the barrier counts stay
// equal and the allocation stays usable.
// A fresh allocation is zero-filled, which is the initial state of every slot. After a
// collective failed (abort, deadline) the counts of the ranks disagree: the allocation can no
// longer be used for collectives.
#ifndef COMMD_KERNELS_SIGNAL_LAYOUT_H_
#define COMMD_KERNELS_SIGNAL_LAYOUT_H_

#include <cstddef>

#include "kernels/host_device.h"

namespace commd::kernels {

inline constexpr int kHostBarrierChannel = 0;
inline constexpr int kHostSleepChannel = 1;
inline constexpr int kHostCallChannel = 2;      // call hash << 1 | NaN/Inf found
inline constexpr int kHostNanCountChannel = 3;  // NaN/Inf count, saturated
inline constexpr int kHostCountChannel = 4;     // first tensor's count, saturated
inline constexpr int kHostShapeChannel = 5;     // kind, op, algorithm, dtype, tensors/root
inline constexpr int kHostPadChannels = 6;      // channels the CPU path needs

COMMD_HOST_DEVICE constexpr size_t PadSlot(int channel, int peer, int world_size) {
  return static_cast<size_t>(channel) * static_cast<size_t>(world_size) + static_cast<size_t>(peer);
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_SIGNAL_LAYOUT_H_
