// NvmlApi: the seam between topology discovery and NVML. The real implementation dlopens
// the NVML library named in the config (so the daemon runs, and reports CPUs and PCI, on
// nodes without an NVIDIA driver); tests load the fake in tests/fixtures/fake_nvml/ the
// same way.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<NvmlApi> nvml, LoadNvml("libnvidia-ml.so.1"));
//   RETURN_IF_ERROR(nvml->Init());
//   ASSIGN_OR_RETURN(unsigned count, nvml->DeviceCount());
//
// Every error message names the NVML call and carries nvmlErrorString's text, e.g.
// "nvmlDeviceGetName: Unknown Error (NVML 999)".
#ifndef COMMD_DAEMON_TOPOLOGY_NVML_API_H_
#define COMMD_DAEMON_TOPOLOGY_NVML_API_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/topology/nvml_types.h"

namespace commd::topology {

// One method per NVML call commd makes. Calls block for as long as NVML does (milliseconds).
// Not thread-safe beyond what NVML itself guarantees; discovery uses one instance from one
// thread.
class NvmlApi {
 public:
  virtual ~NvmlApi() = default;

  virtual absl::Status Init() = 0;
  virtual absl::Status Shutdown() = 0;
  virtual absl::StatusOr<std::string> SystemDriverVersion() = 0;
  virtual absl::StatusOr<unsigned> DeviceCount() = 0;
  virtual absl::StatusOr<nvmlDevice_t> DeviceHandleByIndex(unsigned index) = 0;
  virtual absl::StatusOr<std::string> DeviceName(nvmlDevice_t device) = 0;
  virtual absl::StatusOr<std::string> DeviceUuid(nvmlDevice_t device) = 0;
  virtual absl::StatusOr<nvmlPciInfo_t> DevicePciInfo(nvmlDevice_t device) = 0;
  // Whether `link` is up. NVML answers NVML_ERROR_INVALID_ARGUMENT (kInvalidArgument here)
  // past a device's last link and NVML_ERROR_NOT_SUPPORTED (kUnimplemented) on GPUs
  // without NVLink.
  virtual absl::StatusOr<bool> NvLinkActive(nvmlDevice_t device, unsigned link) = 0;
  virtual absl::StatusOr<nvmlPciInfo_t> NvLinkRemotePciInfo(nvmlDevice_t device, unsigned link) = 0;
  virtual absl::StatusOr<nvmlIntNvLinkDeviceType_t> NvLinkRemoteDeviceType(nvmlDevice_t device,
                                                                           unsigned link) = 0;
};

// dlopens `library_path` (a file name searched the dlopen way, or a path) and resolves every
// entry point NvmlApi needs (common/dl_library.h, whose wording the errors have). Fails with
// kNotFound when the library cannot be loaded (the dlerror text says why) and
// kFailedPrecondition naming the first missing symbol. Does not
// call nvmlInit. The returned object keeps the library loaded until it is destroyed.
absl::StatusOr<std::unique_ptr<NvmlApi>> LoadNvml(const std::string& library_path);

// The status for an NVML return code: the closest absl code, and "<call>: <text> (NVML <rc>)"
// where text is nvmlErrorString's (or a built-in name when `error_string` is null). The
// return code itself rides along as a payload, for NvmlReturnOf.
absl::Status NvmlStatus(nvmlReturn_t rc, absl::string_view call, nvmlErrorString_fn error_string);

// The NVML return code behind a status made by NvmlStatus; NVML_SUCCESS for any other status
// (absl codes alone cannot tell NVML_ERROR_GPU_IS_LOST from NVML_ERROR_IN_USE). Pure.
nvmlReturn_t NvmlReturnOf(const absl::Status& status);

}  // namespace commd::topology

#endif  // COMMD_DAEMON_TOPOLOGY_NVML_API_H_
