// The driver loader against this machine (no NVIDIA driver here: the test says so where there
// is one), a library that is not a driver, and tests/fixtures/fake_libcuda reporting the
// driver version each test picks (the fake reads its environment at each call).
#include "common/cuda_driver_api.h"

#include <cstdlib>
#include <string>

#include "common/cuda_driver.h"
#include "common/testing/scoped_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The load of `library` fails with `code` and a message that starts with `prefix`.
void ExpectLoadError(const std::string& library, absl::StatusCode code, const std::string& prefix) {
  auto api = LoadCudaDriver(library);
  ASSERT_FALSE(api.ok()) << library;
  EXPECT_EQ(api.status().code(), code) << api.status();
  EXPECT_THAT(std::string(api.status().message()), StartsWith(prefix));
}

TEST(CudaDriverApiTest, NoLibraryIsNoDriver) {
  ExpectLoadError("/nonexistent/libcuda.so.1", absl::StatusCode::kUnavailable,
                  "no CUDA driver: cannot load /nonexistent/libcuda.so.1 (");
}

TEST(CudaDriverApiTest, ThisMachineWithoutDriverSaysSo) {
  if (std::getenv(kCudaDriverLibraryEnv) != nullptr) GTEST_SKIP() << "driver library overridden";
  auto api = CudaDriver();
  if (api.ok()) GTEST_SKIP() << "a CUDA driver is present: " << ProbeCudaDriver().summary;
  EXPECT_THAT(std::string(api.status().message()), HasSubstr("libcuda.so.1"));
  const CudaDriverInfo& info = ProbeCudaDriver();
  EXPECT_TRUE(info.built_with_cuda);
  EXPECT_FALSE(info.available);
  EXPECT_EQ(info.driver_version, 0);
  EXPECT_EQ(info.summary, api.status().message());
}

TEST(CudaDriverApiTest, LibraryThatIsNotADriver) {
  ExpectLoadError("libm.so.6", absl::StatusCode::kUnavailable,
                  "libm.so.6 is not a CUDA driver: it exports no cuDriverGetVersion");
}

TEST(CudaDriverApiTest, DriverBelowTheFloorNamesBothVersions) {
  ScopedEnv version("COMMD_FAKE_CUDA_DRIVER_VERSION", "11080");
  ExpectLoadError(COMMD_FAKE_LIBCUDA, absl::StatusCode::kFailedPrecondition,
                  std::string("CUDA driver 11.8 (R520) in ") + COMMD_FAKE_LIBCUDA +
                      " is below commd's floor 12.0 (R525): ");
}

TEST(CudaDriverApiTest, MissingEntryPointIsNamedWithItsAbi) {
  ScopedEnv version("COMMD_FAKE_CUDA_DRIVER_VERSION", "12020");
  ScopedEnv missing("COMMD_FAKE_CUDA_MISSING", "cuMemCreate");
  ExpectLoadError(COMMD_FAKE_LIBCUDA, absl::StatusCode::kUnavailable,
                  std::string("CUDA driver 12.2 (R535) in ") + COMMD_FAKE_LIBCUDA +
                      " has no cuMemCreate at ABI 10.2: cuGetProcAddress_v2 returned "
                      "CUresult 500, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND");
}

TEST(CudaDriverApiTest, InitFailureNamesTheError) {
  ScopedEnv init("COMMD_FAKE_CUDA_INIT_RESULT", "100");
  ExpectLoadError(COMMD_FAKE_LIBCUDA, absl::StatusCode::kUnavailable,
                  std::string("CUDA driver 13.0 (R580) in ") + COMMD_FAKE_LIBCUDA +
                      " present but cuInit failed: CUDA_ERROR_NO_DEVICE (CUresult 100)");
}

// Drivers at and above the floor, among them the 535/550/570 branches a statically linked
// CUDA 13 runtime refuses: every entry point resolves (by base name: the fake, like a driver,
// has no "cuMemAlloc_v2").
class CudaDriverVersionTest : public ::testing::TestWithParam<int> {};

TEST_P(CudaDriverVersionTest, EveryEntryPointResolves) {
  ScopedEnv version("COMMD_FAKE_CUDA_DRIVER_VERSION", std::to_string(GetParam()));
  auto api = LoadCudaDriver(COMMD_FAKE_LIBCUDA);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->driver_version, GetParam());
  EXPECT_EQ(api->library, COMMD_FAKE_LIBCUDA);
#define COMMD_EXPECT_RESOLVED_(member, symbol, version) EXPECT_NE(api->member, nullptr) << #symbol;
  COMMD_CUDA_DRIVER_FUNCTIONS(COMMD_EXPECT_RESOLVED_)
#undef COMMD_EXPECT_RESOLVED_
  int devices = -1;
  EXPECT_EQ(api->device_get_count(&devices), CUDA_SUCCESS);
  EXPECT_EQ(devices, 0);
}

INSTANTIATE_TEST_SUITE_P(AtOrAboveFloor, CudaDriverVersionTest,
                         ::testing::Values(kCudaDriverFloor, 12020, 12040, 12080, 13000));

// The SDK's runtime against the node's driver: a runtime needs a driver of its major version
// (minor version compatibility), so a CUDA 13 build refuses the R535-R570 drivers the loader
// accepts, naming both versions and what serves them.
TEST(CheckDriverServesRuntimeTest, ARuntimeNeedsADriverOfItsMajorVersion) {
  EXPECT_TRUE(CheckDriverServesRuntime(13000, "libcuda.so.1", 13000).ok());
  EXPECT_TRUE(CheckDriverServesRuntime(13000, "libcuda.so.1", 13020).ok());  // minor: compatible
  EXPECT_TRUE(CheckDriverServesRuntime(13020, "libcuda.so.1", 12080).ok());
  EXPECT_TRUE(CheckDriverServesRuntime(12000, "libcuda.so.1", 12080).ok());
  const absl::Status old = CheckDriverServesRuntime(12080, "libcuda.so.1", 13000);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.message(),
            "the SDK was built with CUDA runtime 13.0, which needs CUDA driver 13.0 (R580) or "
            "newer; this node's driver is 12.8 (R570) (libcuda.so.1): install a commd build made "
            "with the CUDA 12.x toolkit (it serves drivers from 12.0 (R525) on), or upgrade the "
            "NVIDIA driver to 13.0 (R580) or newer (docs/operations.md \"The CUDA driver\")");
  EXPECT_THAT(std::string(CheckDriverServesRuntime(12020, "/x/libcuda.so.1", 13010).message()),
              HasSubstr("runtime 13.1, which needs CUDA driver 13.0 (R580) or newer; this node's "
                        "driver is 12.2 (R535) (/x/libcuda.so.1)"));
}

TEST(CudaDriverVersionTextTest, NamesTheBranchWhereKnown) {
  EXPECT_EQ(CudaDriverVersionText(12020), "12.2 (R535)");
  EXPECT_EQ(CudaDriverVersionText(13000), "13.0 (R580)");
  EXPECT_EQ(CudaDriverVersionText(12070), "12.7");
}

}  // namespace
}  // namespace commd
