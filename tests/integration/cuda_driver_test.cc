// How the real daemon reports the CUDA driver it finds (NodeService status cuda_status and its
// log): none on this machine, and tests/fixtures/fake_libcuda (through
// COMMD_CUDA_DRIVER_LIBRARY) as a driver below commd's floor and as one above it.
#include <string>
#include <vector>

#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class CudaDriverTest : public ::testing::Test {
 protected:
  // The daemon's cuda_status with `env` added to its environment.
  std::string CudaStatus(const std::vector<std::string>& env) { return Status(env).cuda_status(); }

  // The daemon's GetStatus with `env` added to its environment.
  v1::NodeStatus Status(const std::vector<std::string>& env) {
    DaemonProcess::Options options;
    options.extra_env = env;
    auto daemon = DaemonProcess::Start(tmp_.Join("run"), options);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (!daemon.ok()) return {};
    ClientOptions client_options;
    client_options.runtime_dir = (*daemon)->runtime_dir();
    auto client = Client::Connect(client_options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return {};
    auto status = (*client)->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::NodeStatus();
  }

  // A daemon built without CUDA loads no driver (the tests skip then).
  static bool BuiltWithoutCuda(const std::string& status) {
    return status.rfind("built without CUDA", 0) == 0;
  }

  TempDir tmp_;
};

TEST_F(CudaDriverTest, NoDriverOnThisMachineSaysSo) {
  const std::string status = CudaStatus({});
  if (BuiltWithoutCuda(status)) GTEST_SKIP() << status;
  if (status.find(" device(s), CUDA driver ") != std::string::npos) {
    GTEST_SKIP() << "a CUDA driver is present: " << status;
  }
  EXPECT_THAT(status, StartsWith("no CUDA driver: cannot load libcuda.so.1 ("));
}

TEST_F(CudaDriverTest, DriverBelowTheFloorIsNamedNotMissing) {
  const v1::NodeStatus status =
      Status({std::string("COMMD_CUDA_DRIVER_LIBRARY=") + COMMD_FAKE_LIBCUDA,
              "COMMD_FAKE_CUDA_DRIVER_VERSION=11080"});
  if (BuiltWithoutCuda(status.cuda_status())) GTEST_SKIP() << status.cuda_status();
  EXPECT_THAT(status.cuda_status(),
              StartsWith(std::string("CUDA driver 11.8 (R520) in ") + COMMD_FAKE_LIBCUDA +
                         " is below commd's floor 12.0 (R525): "));
  EXPECT_TRUE(status.cuda_driver_below_floor());
  EXPECT_EQ(status.cuda_driver_floor(), 12000);
  EXPECT_EQ(status.cuda_driver_version(), 0);  // none loaded
}

// R535 (CUDA 12.2): what a daemon with a statically linked CUDA 13 runtime called "no CUDA
// driver". The fake has no devices, so the daemon keeps to host memory.
TEST_F(CudaDriverTest, DriverAtR535Loads) {
  const std::string status =
      CudaStatus({std::string("COMMD_CUDA_DRIVER_LIBRARY=") + COMMD_FAKE_LIBCUDA,
                  "COMMD_FAKE_CUDA_DRIVER_VERSION=12020"});
  if (BuiltWithoutCuda(status)) GTEST_SKIP() << status;
  EXPECT_EQ(status, std::string("CUDA driver 12.2 (R535) in ") + COMMD_FAKE_LIBCUDA +
                        " but no CUDA device");
}

TEST_F(CudaDriverTest, DriverAboveTheFloorReportsItsVersion) {
  const v1::NodeStatus status =
      Status({std::string("COMMD_CUDA_DRIVER_LIBRARY=") + COMMD_FAKE_LIBCUDA,
              "COMMD_FAKE_CUDA_DRIVER_VERSION=12080", "COMMD_FAKE_CUDA_DEVICES=2"});
  if (BuiltWithoutCuda(status.cuda_status())) GTEST_SKIP() << status.cuda_status();
  EXPECT_EQ(status.cuda_status(),
            std::string("2 device(s), CUDA driver 12.8 (R570) in ") + COMMD_FAKE_LIBCUDA);
  EXPECT_EQ(status.cuda_driver_version(), 12080);
  EXPECT_FALSE(status.cuda_driver_below_floor());
}

}  // namespace
}  // namespace commd::testing
