#include "daemon/topology/nvml_api.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/dl_library.h"
#include "common/status_macros.h"

namespace commd::topology {
namespace {

constexpr char kNvmlReturnPayload[] = "commd.topology/nvml-return";

absl::StatusCode NvmlCode(nvmlReturn_t rc) {
  switch (rc) {
    case NVML_SUCCESS:
      return absl::StatusCode::kOk;
    case NVML_ERROR_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case NVML_ERROR_NOT_SUPPORTED:
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return absl::StatusCode::kUnimplemented;
    case NVML_ERROR_NO_PERMISSION:
      return absl::StatusCode::kPermissionDenied;
    case NVML_ERROR_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case NVML_ERROR_INSUFFICIENT_SIZE:
    case NVML_ERROR_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case NVML_ERROR_UNINITIALIZED:
    case NVML_ERROR_DRIVER_NOT_LOADED:
    case NVML_ERROR_LIBRARY_NOT_FOUND:
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case NVML_ERROR_TIMEOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case NVML_ERROR_GPU_IS_LOST:
    case NVML_ERROR_IN_USE:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kUnknown;
  }
}

// Keeps the library loaded and the resolved entry points; each method is one NVML call
// turned into a status.
class DlNvml final : public NvmlApi {
 public:
  explicit DlNvml(DlLibrary library) : library_(std::move(library)) {}

  absl::Status Resolve();

  absl::Status Init() override { return Check(init_(), "nvmlInit_v2"); }
  absl::Status Shutdown() override { return Check(shutdown_(), "nvmlShutdown"); }
  absl::StatusOr<std::string> SystemDriverVersion() override {
    char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
    RETURN_IF_ERROR(Check(driver_version_(buf, sizeof(buf)), "nvmlSystemGetDriverVersion"));
    return std::string(buf);
  }
  absl::StatusOr<unsigned> DeviceCount() override {
    unsigned count = 0;
    RETURN_IF_ERROR(Check(count_(&count), "nvmlDeviceGetCount_v2"));
    return count;
  }
  absl::StatusOr<nvmlDevice_t> DeviceHandleByIndex(unsigned index) override {
    nvmlDevice_t device = nullptr;
    RETURN_IF_ERROR(Check(handle_by_index_(index, &device), "nvmlDeviceGetHandleByIndex_v2"));
    return device;
  }
  absl::StatusOr<std::string> DeviceName(nvmlDevice_t device) override {
    char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
    RETURN_IF_ERROR(Check(name_(device, buf, sizeof(buf)), "nvmlDeviceGetName"));
    return std::string(buf);
  }
  absl::StatusOr<std::string> DeviceUuid(nvmlDevice_t device) override {
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    RETURN_IF_ERROR(Check(uuid_(device, buf, sizeof(buf)), "nvmlDeviceGetUUID"));
    return std::string(buf);
  }
  absl::StatusOr<nvmlPciInfo_t> DevicePciInfo(nvmlDevice_t device) override {
    nvmlPciInfo_t pci = {};
    RETURN_IF_ERROR(Check(pci_info_(device, &pci), "nvmlDeviceGetPciInfo_v3"));
    return pci;
  }
  absl::StatusOr<bool> NvLinkActive(nvmlDevice_t device, unsigned link) override {
    nvmlEnableState_t state = NVML_FEATURE_DISABLED;
    RETURN_IF_ERROR(Check(link_state_(device, link, &state), "nvmlDeviceGetNvLinkState"));
    return state == NVML_FEATURE_ENABLED;
  }
  absl::StatusOr<nvmlPciInfo_t> NvLinkRemotePciInfo(nvmlDevice_t device, unsigned link) override {
    nvmlPciInfo_t pci = {};
    RETURN_IF_ERROR(Check(remote_pci_(device, link, &pci), "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
    return pci;
  }
  absl::StatusOr<nvmlIntNvLinkDeviceType_t> NvLinkRemoteDeviceType(nvmlDevice_t device,
                                                                   unsigned link) override {
    nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    RETURN_IF_ERROR(
        Check(remote_type_(device, link, &type), "nvmlDeviceGetNvLinkRemoteDeviceType"));
    return type;
  }

 private:
  absl::Status Check(nvmlReturn_t rc, absl::string_view call) const {
    return NvmlStatus(rc, call, error_string_);
  }

  DlLibrary library_;  // closed with this object
  nvmlInit_v2_fn init_ = nullptr;
  nvmlShutdown_fn shutdown_ = nullptr;
  nvmlErrorString_fn error_string_ = nullptr;
  nvmlSystemGetDriverVersion_fn driver_version_ = nullptr;
  nvmlDeviceGetCount_v2_fn count_ = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn handle_by_index_ = nullptr;
  nvmlDeviceGetName_fn name_ = nullptr;
  nvmlDeviceGetUUID_fn uuid_ = nullptr;
  nvmlDeviceGetPciInfo_v3_fn pci_info_ = nullptr;
  nvmlDeviceGetNvLinkState_fn link_state_ = nullptr;
  nvmlDeviceGetNvLinkRemotePciInfo_v2_fn remote_pci_ = nullptr;
  nvmlDeviceGetNvLinkRemoteDeviceType_fn remote_type_ = nullptr;
};

absl::Status DlNvml::Resolve() {
  const DlSymbol table[] = {
      {"nvmlInit_v2", DlAddress(&init_)},
      {"nvmlShutdown", DlAddress(&shutdown_)},
      {"nvmlErrorString", DlAddress(&error_string_)},
      {"nvmlSystemGetDriverVersion", DlAddress(&driver_version_)},
      {"nvmlDeviceGetCount_v2", DlAddress(&count_)},
      {"nvmlDeviceGetHandleByIndex_v2", DlAddress(&handle_by_index_)},
      {"nvmlDeviceGetName", DlAddress(&name_)},
      {"nvmlDeviceGetUUID", DlAddress(&uuid_)},
      {"nvmlDeviceGetPciInfo_v3", DlAddress(&pci_info_)},
      {"nvmlDeviceGetNvLinkState", DlAddress(&link_state_)},
      {"nvmlDeviceGetNvLinkRemotePciInfo_v2", DlAddress(&remote_pci_)},
      {"nvmlDeviceGetNvLinkRemoteDeviceType", DlAddress(&remote_type_)},
  };
  return library_.Resolve(table, "an NVML library");
}

}  // namespace

absl::Status NvmlStatus(nvmlReturn_t rc, absl::string_view call, nvmlErrorString_fn error_string) {
  if (rc == NVML_SUCCESS) return absl::OkStatus();
  const char* text = error_string != nullptr ? error_string(rc) : nullptr;
  absl::Status status(NvmlCode(rc), absl::StrCat(call, ": ", text != nullptr ? text : "error",
                                                 " (NVML ", static_cast<int>(rc), ")"));
  status.SetPayload(kNvmlReturnPayload, absl::Cord(absl::StrCat(static_cast<int>(rc))));
  return status;
}

nvmlReturn_t NvmlReturnOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kNvmlReturnPayload);
  int rc = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &rc)) return NVML_SUCCESS;
  return static_cast<nvmlReturn_t>(rc);
}

absl::StatusOr<std::unique_ptr<NvmlApi>> LoadNvml(const std::string& library_path) {
  if (library_path.empty()) return absl::NotFoundError("no NVML library configured");
  absl::StatusOr<DlLibrary> library = DlLibrary::Open(library_path);
  // NOT_FOUND: no library is the normal case of a node without an NVIDIA driver.
  if (!library.ok()) return absl::NotFoundError(library.status().message());
  auto nvml = std::make_unique<DlNvml>(*std::move(library));
  if (absl::Status st = nvml->Resolve(); !st.ok()) {
    return absl::FailedPreconditionError(st.message());
  }
  return std::unique_ptr<NvmlApi>(std::move(nvml));
}

}  // namespace commd::topology
