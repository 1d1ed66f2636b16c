#include "daemon/topology/nvml_api.h"

#include <stdlib.h>

#include <fstream>

#include "daemon/topology/fake_sysfs.h"
#include "gtest/gtest.h"

namespace commd::topology {
namespace {

class NvmlApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = (dir_.path() / "nvml.json").string();
    setenv("COMMD_FAKE_NVML_CONFIG", config_.c_str(), 1);
  }
  void TearDown() override { unsetenv("COMMD_FAKE_NVML_CONFIG"); }
  void WriteConfig(const std::string& json) { std::ofstream(config_) << json; }

  TempDir dir_;
  std::string config_;
};

TEST_F(NvmlApiTest, MissingLibraryIsNotFound) {
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvml("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(nvml.status().message().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos)
      << nvml.status();
}

TEST_F(NvmlApiTest, LibraryWithoutNvmlNamesTheMissingSymbol) {
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvml("libm.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(
      nvml.status().message().find("libm.so.6 is not an NVML library: it exports no nvmlInit_v2"),
      std::string::npos)
      << nvml.status();
}

TEST_F(NvmlApiTest, CallsReachTheLibrary) {
  WriteConfig(R"({"driver_version": "550.54.15", "devices": [
      {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "pci_bus_id": "0000:1b:00.0",
       "nvlinks": [{"type": "switch", "remote": "0000:e1:00.0", "count": 2},
                   {"type": "gpu", "remote": "0000:43:00.0", "active": false}]},
      {"name": "NVIDIA L40S", "uuid": "GPU-2", "pci_bus_id": "0001:c3:00.0"}]})");
  absl::StatusOr<std::unique_ptr<NvmlApi>> loaded = LoadNvml(COMMD_FAKE_NVML);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  NvmlApi& nvml = **loaded;
  ASSERT_TRUE(nvml.Init().ok());
  EXPECT_EQ(*nvml.SystemDriverVersion(), "550.54.15");
  ASSERT_EQ(*nvml.DeviceCount(), 2u);
  nvmlDevice_t gpu0 = *nvml.DeviceHandleByIndex(0);
  nvmlDevice_t gpu1 = *nvml.DeviceHandleByIndex(1);
  EXPECT_EQ(*nvml.DeviceName(gpu0), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(*nvml.DeviceUuid(gpu1), "GPU-2");
  nvmlPciInfo_t pci = *nvml.DevicePciInfo(gpu1);
  EXPECT_STREQ(pci.busId, "00000001:C3:00.0");  // NVML's own spelling
  EXPECT_STREQ(pci.busIdLegacy, "0001:C3:00.0");
  EXPECT_EQ(pci.domain, 1u);
  EXPECT_EQ(pci.bus, 0xc3u);
  EXPECT_TRUE(*nvml.NvLinkActive(gpu0, 1));
  EXPECT_FALSE(*nvml.NvLinkActive(gpu0, 2));
  EXPECT_EQ(*nvml.NvLinkRemoteDeviceType(gpu0, 0), NVML_NVLINK_DEVICE_TYPE_SWITCH);
  EXPECT_STREQ(nvml.NvLinkRemotePciInfo(gpu0, 0)->busId, "00000000:E1:00.0");
  // Past the last link, and on a GPU without NVLink: the codes that end a link scan.
  EXPECT_EQ(nvml.NvLinkActive(gpu0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nvml.NvLinkActive(gpu1, 0).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(nvml.Shutdown().ok());
  EXPECT_EQ(nvml.DeviceCount().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(NvmlApiTest, InjectedFailureCarriesNvmlErrorString) {
  WriteConfig(R"({"devices": [{"name": "a", "uuid": "GPU-1", "pci_bus_id": "0000:1b:00.0"}],
                  "failures": [{"call": "nvmlDeviceGetUUID", "device": 0,
                                "error": "NVML_ERROR_UNKNOWN"},
                               {"call": "nvmlDeviceGetName", "error": 15}]})");
  absl::StatusOr<std::unique_ptr<NvmlApi>> loaded = LoadNvml(COMMD_FAKE_NVML);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  NvmlApi& nvml = **loaded;
  ASSERT_TRUE(nvml.Init().ok());
  nvmlDevice_t gpu0 = *nvml.DeviceHandleByIndex(0);
  absl::Status uuid = nvml.DeviceUuid(gpu0).status();
  EXPECT_EQ(uuid.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(uuid.message(), "nvmlDeviceGetUUID: Unknown Error (NVML 999)");
  absl::Status name = nvml.DeviceName(gpu0).status();
  EXPECT_EQ(name.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(name.message(), "nvmlDeviceGetName: GPU is lost (NVML 15)");
  EXPECT_TRUE(nvml.DevicePciInfo(gpu0).ok());
  EXPECT_TRUE(nvml.Shutdown().ok());
}

TEST_F(NvmlApiTest, NoConfigLooksLikeNoDriver) {
  unsetenv("COMMD_FAKE_NVML_CONFIG");
  absl::StatusOr<std::unique_ptr<NvmlApi>> loaded = LoadNvml(COMMD_FAKE_NVML);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::Status init = (*loaded)->Init();
  EXPECT_EQ(init.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(init.message(), "nvmlInit_v2: Driver Not Loaded (NVML 9)");
}

TEST(NvmlStatusTest, CarriesTheReturnCode) {
  EXPECT_EQ(NvmlReturnOf(NvmlStatus(NVML_ERROR_GPU_IS_LOST, "nvmlDeviceGetName", nullptr)),
            NVML_ERROR_GPU_IS_LOST);
  EXPECT_EQ(NvmlReturnOf(absl::UnavailableError("nvmlDeviceGetName: GPU is lost (NVML 15)")),
            NVML_SUCCESS);
  EXPECT_EQ(NvmlReturnOf(absl::OkStatus()), NVML_SUCCESS);
}

TEST(NvmlStatusTest, WithoutErrorStringFunction) {
  EXPECT_TRUE(NvmlStatus(NVML_SUCCESS, "nvmlInit_v2", nullptr).ok());
  EXPECT_EQ(NvmlStatus(NVML_ERROR_NO_PERMISSION, "nvmlInit_v2", nullptr).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace commd::topology
