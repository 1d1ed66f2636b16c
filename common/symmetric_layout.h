// Layout of one rank's symmetric allocation, shared by the daemon (which sizes it) and the SDK
// and kernels (which use it): [signal pad | padding to kDataAlignment | data].
//
// The pad holds one uint32 slot per (channel, peer); channels let consecutive collectives and
// the barrier use separate slots.
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

constexpr size_t SignalPadBytes(int world_size) {
  return kSignalPadChannels * static_cast<size_t>(world_size) * sizeof(uint32_t);
}

constexpr size_t SymmetricDataOffset(int world_size) {
  return AlignUp(SignalPadBytes(world_size), kDataAlignment);
}

}  // namespace commd

#endif  // COMMD_COMMON_SYMMETRIC_LAYOUT_H_
