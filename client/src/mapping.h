// Internal to the SDK: a buffer of the daemon's mapped into this process, host or device.
#ifndef COMMD_CLIENT_SRC_MAPPING_H_
#define COMMD_CLIENT_SRC_MAPPING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "commd/v1/memory.pb.h"
#include "common/unique_fd.h"

namespace commd {

class Mapping {
 public:
  virtual ~Mapping() = default;  // unmaps
  virtual void* data() const = 0;
};

// mmap(MAP_SHARED) of a memfd from the daemon.
absl::StatusOr<std::unique_ptr<Mapping>> MapHostBuffer(const UniqueFd& fd, size_t bytes);

// Imports a CUDA allocation into this process on `local_device`: a cuMem POSIX fd (reserve,
// map, grant read/write to the local device) or, with no fd, a legacy IPC handle from
// `handle.opaque_handle()`. UNIMPLEMENTED in builds without CUDA; the driver API is reached
// through entry points, so the SDK loads on machines without a driver.
absl::StatusOr<std::unique_ptr<Mapping>> MapCudaBuffer(const v1::BufferHandle& handle, UniqueFd fd,
                                                       int local_device);

// The UUID of this process's CUDA device `local_device` ("GPU-...", cuDeviceGetUuid), which
// the SDK sends with "cuda:N" so the daemon allocates on the same GPU whatever ordinal it has
// there. Empty for host (-1) and when there is no CUDA here (no CUDA build, no driver): the
// daemon then goes by the ordinal and says what it lacks. An error when the driver cannot name
// the device (no such ordinal, a lost GPU): guessing by ordinal would place memory elsewhere.
absl::StatusOr<std::string> CudaDeviceUuid(int local_device);

// This process's ordinal of the CUDA device whose UUID is `uuid`: how a buffer the daemon
// describes by UUID (BufferHandle.device_uuid) is mapped on the GPU it lives on whatever
// CUDA_VISIBLE_DEVICES this process has. `fallback` (the daemon's ordinal) when `uuid` is
// empty (host memory, a creator that sent none); FAILED_PRECONDITION naming the UUID and the
// devices seen when none has it.
absl::StatusOr<int> CudaOrdinalOfUuid(const std::string& uuid, int fallback,
                                      const std::string& what);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_MAPPING_H_
