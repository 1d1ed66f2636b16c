// Layout of one rank's symmetric allocation, shared by the daemon (which sizes it) and the SDK
// and kernels (which use it): [signal pad | padding to kDataAlignment | data].
//
// The signal pad is [slots | exchange area]: one uint32 slot per (channel, peer) (channels let
// consecutive collectives and the barrier use separate slots), then the CPU collectives'
// exchange area, a line with the rank's sleeping flag and 2 parities x world size slots of
// ExchangeSlotBytes, one per (parity, source rank), where peers leave this rank the call they
// make and, for small all-reduces, their data (kernels/signal_layout.h). A peer writes only
// its own slots of an area.
#ifndef COMMD_COMMON_SYMMETRIC_LAYOUT_H_
#define COMMD_COMMON_SYMMETRIC_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace commd {

inline constexpr size_t kDataAlignment = 128;
inline constexpr size_t kSignalPadChannels = 16;
inline constexpr int kMaxWorldSize = 1024;

constexpr size_t AlignUp(size_t n, size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// One exchange slot: a 64-byte header line (flag, call words, the payload's first 32 bytes)
// and more payload lines, with the area kept within 2 x kExchangeAreaBudget whatever the world
// size: slots of kExchangeSlotMaxBytes (4 KiB of payload and more) up to 8 ranks, 2 KiB at 16,
// one line (32 bytes of payload) from 512.
inline constexpr size_t kExchangeLineBytes = 64;
inline constexpr size_t kExchangeSlotMaxBytes = 4096 + kExchangeLineBytes;
inline constexpr size_t kExchangeAreaBudget = 8 * kExchangeSlotMaxBytes;

constexpr size_t ExchangeSlotBytes(int world_size) {
  const size_t share = kExchangeAreaBudget / static_cast<size_t>(world_size > 0 ? world_size : 1);
  const size_t lines = share / kExchangeLineBytes;
  const size_t bytes = (lines > 0 ? lines : 1) * kExchangeLineBytes;
  return bytes < kExchangeSlotMaxBytes ? bytes : kExchangeSlotMaxBytes;
}

// Where the exchange area starts in the pad. Its first line holds the rank's sleeping flag
// alone (every peer that writes to the rank reads it; the rank writes it only to go to sleep),
// the slots follow.
constexpr size_t ExchangeAreaOffset(int world_size) {
  return AlignUp(kSignalPadChannels * static_cast<size_t>(world_size) * sizeof(uint32_t),
                 kExchangeLineBytes);
}

constexpr size_t ExchangeSlotsOffset(int world_size) {
  return ExchangeAreaOffset(world_size) + kExchangeLineBytes;
}

constexpr size_t SignalPadBytes(int world_size) {
  return ExchangeSlotsOffset(world_size) +
         2 * static_cast<size_t>(world_size) * ExchangeSlotBytes(world_size);
}

constexpr size_t SymmetricDataOffset(int world_size) {
  return AlignUp(SignalPadBytes(world_size), kDataAlignment);
}

}  // namespace commd

#endif  // COMMD_COMMON_SYMMETRIC_LAYOUT_H_
