// Where the daemon's communication memory comes from. One interface, one backend per kind of
// memory; everything that does not depend on the kind (ownership, limits, lifetimes, tokens)
// lives above it in AllocationTable.
//
//   ASSIGN_OR_RETURN(auto backend, CreateHostMemoryBackend());
//   ASSIGN_OR_RETURN(MemoryBlock block, backend->Allocate(Device::Host(), 1 << 20, "job/g/0"));
//   ASSIGN_OR_RETURN(ExportedMemory handle, backend->Export(block));   // what a client imports
//   backend->Release(std::move(block));
//
// Backends are thread-safe.
#ifndef COMMD_DAEMON_MEMORY_MEMORY_BACKEND_H_
#define COMMD_DAEMON_MEMORY_MEMORY_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace commd::memory {

struct Device {
  enum class Kind { kHost, kCuda };
  Kind kind = Kind::kHost;
  int index = 0;  // CUDA device ordinal

  static Device Host() { return {}; }
  static Device Cuda(int index) { return {Kind::kCuda, index}; }
  // "host" or "cuda:N".
  std::string ToString() const;
  bool operator==(const Device&) const = default;
};

// Parses "host" or "cuda:N" (N from 0 to 1023); anything else is INVALID_ARGUMENT naming it.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Memory a backend allocated. Moving it moves ownership; Release gives it back.
struct MemoryBlock {
  Device device;
  size_t bytes = 0;             // the size actually allocated (granularity applied)
  UniqueFd fd;                  // host: the sealed memfd; cuda: the cuMem handle's POSIX fd
  uint64_t handle = 0;          // cuda: CUmemGenericAllocationHandle; 0 otherwise
  uint64_t device_pointer = 0;  // cuda legacy IPC: the cuMemAlloc'd pointer; 0 otherwise
  std::string opaque_handle;    // cuda: fabric or legacy IPC handle bytes; empty for host
  // What opaque_handle is: both kinds are 64 bytes, so the client is told, never left to guess.
  enum class OpaqueKind { kNone, kLegacyIpc, kFabric };
  OpaqueKind opaque_kind = OpaqueKind::kNone;
};

// What a client needs to map a block: a file descriptor to pass over the fd channel and,
// for CUDA, the opaque bytes of a fabric or legacy IPC handle that travel in gRPC.
struct ExportedMemory {
  UniqueFd fd;                // a new descriptor the caller owns (send it, then close it)
  std::string opaque_handle;  // cuda fabric/legacy IPC handle bytes; empty for host
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // "host" or "cuda": the metric label and the name in errors.
  virtual absl::string_view name() const = 0;
  // Allocates at least `bytes` (> 0) on `device`; `label` names it for debugging (memfd name).
  // INVALID_ARGUMENT for a device this backend does not serve or a zero size;
  // RESOURCE_EXHAUSTED when the memory is not there.
  virtual absl::StatusOr<MemoryBlock> Allocate(const Device& device, size_t bytes,
                                               absl::string_view label) = 0;
  virtual absl::StatusOr<ExportedMemory> Export(const MemoryBlock& block) = 0;
  virtual void Release(MemoryBlock block) = 0;
  // The device whose UUID is `uuid` ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as
  // nvidia-smi prints it) in this process's enumeration: a client's "cuda:0" under its own
  // CUDA_VISIBLE_DEVICES may be another ordinal here. FAILED_PRECONDITION naming the UUID
  // (and the UUIDs this backend sees) when it has no such device.
  virtual absl::StatusOr<Device> DeviceByUuid(absl::string_view uuid) const;
};

// memfd-backed host memory: works on any Linux; the memfd is sealed against resizing so a
// client can neither shrink it under the daemon nor grow the job past its limit.
absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateHostMemoryBackend();

// cuMem-backed GPU memory (POSIX fd handles; fabric or legacy IPC handles where supported).
// UNAVAILABLE when the binary was built without CUDA or no driver/device is present.
absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend();

}  // namespace commd::memory

#endif  // COMMD_DAEMON_MEMORY_MEMORY_BACKEND_H_
