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
inline constexpr int kHostPadChannels = 2;  // channels the CPU path needs

COMMD_HOST_DEVICE constexpr size_t PadSlot(int channel, int peer, int world_size) {
  return static_cast<size_t>(channel) * static_cast<size_t>(world_size) + static_cast<size_t>(peer);
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_SIGNAL_LAYOUT_H_
