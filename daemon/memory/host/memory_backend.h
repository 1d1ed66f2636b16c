// The host memory backend: sealed memfds. See daemon/memory/memory_backend.h.
#ifndef COMMD_DAEMON_MEMORY_HOST_MEMORY_BACKEND_H_
#define COMMD_DAEMON_MEMORY_HOST_MEMORY_BACKEND_H_

#include "daemon/memory/memory_backend.h"

namespace commd::memory {

class HostMemoryBackend final : public MemoryBackend {
 public:
  absl::string_view name() const override { return "host"; }
  absl::StatusOr<MemoryBlock> Allocate(const Device& device, size_t bytes,
                                       absl::string_view label) override;
  absl::StatusOr<ExportedMemory> Export(const MemoryBlock& block) override;
  void Release(MemoryBlock block) override;
};

}  // namespace commd::memory

#endif  // COMMD_DAEMON_MEMORY_HOST_MEMORY_BACKEND_H_
