// CreateCudaMemoryBackend for builds without CUDA.
#include "daemon/memory/memory_backend.h"

namespace commd::memory {

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend() {
  return absl::UnavailableError("built without CUDA (COMMD_CUDA=OFF or no nvcc at build time)");
}

}  // namespace commd::memory
