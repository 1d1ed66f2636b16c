// The cuBLAS table (kernels/cuda/cublas_api.h): what a missing or wrong library is told as,
// which cuBLAS is chosen (tests/fixtures/fake_libcublas copied under cuBLAS's names: one
// already loaded first, then by the driver, each after a create/destroy round trip), and that
// the toolkit's real cuBLAS resolves every entry point (dlopen needs no GPU).
#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/scoped_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Copies of the fake cuBLAS as <dir>/libcublas.so.13 and .so.12, in a directory of the test's
// own: a library dlopen()ed by one test stays loaded for the process, so each test has new
// files (new libraries to the loader). The fake's calls go to a log, one "<path> <call>" a line.
class ChooseCublasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        ::testing::TempDir() + "/choose_cublas_" + std::to_string(::getpid()) + "_" + info->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* name : {"libcublas.so.13", "libcublas.so.12"}) {
      std::filesystem::copy_file(COMMD_FAKE_LIBCUBLAS, dir_ + "/" + name);
    }
    v13_ = dir_ + "/libcublas.so.13";
    v12_ = dir_ + "/libcublas.so.12";
    log_ = dir_ + "/calls";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<CublasCandidate> Candidates() const {
    return {{v13_.c_str(), 13000}, {v12_.c_str(), 12000}};
  }
  // The calls of the log, each "<13|12> <call>".
  std::vector<std::string> Calls() const {
    std::ifstream in(log_);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      const bool is13 = line.rfind(v13_ + " ", 0) == 0;
      out.push_back(absl::StrCat(is13 ? "13 " : "12 ", line.substr(line.find(' ') + 1)));
    }
    return out;
  }

  std::string dir_, v13_, v12_, log_;
};

TEST_F(ChooseCublasTest, ANewEnoughDriverGetsTheNewestAfterItsRoundTrip) {
  ScopedEnv calls("COMMD_FAKE_CUBLAS_CALL_LOG", log_);
  auto api = ChooseCublas(Candidates(), 13000);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->library, v13_);
  EXPECT_NE(api->set_workspace, nullptr);
  EXPECT_THAT(Calls(), ElementsAre("13 cublasCreate_v2", "13 cublasDestroy_v2"));
}

// The CUDA-12 driver of many H100/H200 nodes: cuBLAS 13 is not even tried.
TEST_F(ChooseCublasTest, ACuda12DriverGetsCublas12) {
  ScopedEnv calls("COMMD_FAKE_CUBLAS_CALL_LOG", log_);
  auto api = ChooseCublas(Candidates(), 12080);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->library, v12_);
  EXPECT_THAT(Calls(), ElementsAre("12 cublasCreate_v2", "12 cublasDestroy_v2"));
}

// A cuBLAS that loads but cannot make a handle is passed over for the next.
TEST_F(ChooseCublasTest, AFailedRoundTripFallsThroughToTheNext) {
  ScopedEnv calls("COMMD_FAKE_CUBLAS_CALL_LOG", log_);
  ScopedEnv fails("COMMD_FAKE_CUBLAS_CREATE_FAILS", "so.13");
  auto api = ChooseCublas(Candidates(), 13000);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->library, v12_);
  EXPECT_THAT(Calls(),
              ElementsAre("13 cublasCreate_v2", "12 cublasCreate_v2", "12 cublasDestroy_v2"));
}

// PyTorch loaded cuBLAS 12 before commd's first fused matmul: commd takes that one, though
// the driver would serve 13, and never loads a second.
TEST_F(ChooseCublasTest, ACublasTheProcessAlreadyLoadedComesFirst) {
  void* torch_s = ::dlopen(v12_.c_str(), RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(torch_s, nullptr) << ::dlerror();
  ScopedEnv calls("COMMD_FAKE_CUBLAS_CALL_LOG", log_);
  auto api = ChooseCublas(Candidates(), 13000);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->library, v12_);
  EXPECT_THAT(Calls(), ElementsAre("12 cublasCreate_v2", "12 cublasDestroy_v2"));
  EXPECT_EQ(::dlopen(v13_.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << "cuBLAS 13 was loaded";
}

TEST_F(ChooseCublasTest, NoneServingIsFailedPreconditionNamingEachAndWhy) {
  ScopedEnv fails("COMMD_FAKE_CUBLAS_CREATE_FAILS", "so.12");
  auto api = ChooseCublas(Candidates(), 12080);
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(api.status())) << api.status();
  EXPECT_THAT(std::string(api.status().message()),
              HasSubstr(v13_ + " needs CUDA driver 13.0 or newer; the driver is 12.8; " + v12_ +
                        ": cublasCreate failed: CUBLAS_STATUS_NOT_INITIALIZED: the library was "
                        "not initialized (cublasStatus_t 1)"));
  EXPECT_THAT(std::string(api.status().message()),
              HasSubstr("the fused matmuls on CUDA buffers need cuBLAS (" + v13_ + " or " + v12_));
}

TEST(CublasApiTest, MissingLibraryIsUnavailableNamingIt) {
  auto api = LoadCublas("/nonexistent/libcublas.so.13");
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsUnavailable(api.status())) << api.status();
  EXPECT_NE(api.status().message().find("cannot load /nonexistent/libcublas.so.13"),
            std::string::npos)
      << api.status();
}

TEST(CublasApiTest, LibraryWithoutTheEntryPointsIsNamedWithTheFirstMissing) {
  auto api = LoadCublas("libc.so.6");
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsUnavailable(api.status())) << api.status();
  EXPECT_NE(api.status().message().find("libc.so.6 is not a usable cuBLAS: it exports no "
                                        "cublasCreate_v2"),
            std::string::npos)
      << api.status();
}

TEST(CublasApiTest, TheToolkitsCublasResolvesEveryEntryPoint) {
  const char* home = std::getenv("CUDA_HOME");
  const std::string dir = std::string(home != nullptr ? home : "/usr/local/cuda") + "/lib64";
  std::string library;
  for (const CublasCandidate& c : kCublasLibraries) {
    if (std::filesystem::exists(dir + "/" + c.library)) {
      library = dir + "/" + c.library;
      break;
    }
  }
  if (library.empty()) GTEST_SKIP() << "no libcublas.so.13 or .so.12 in " << dir;
  auto api = LoadCublas(library);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->library, library);
  EXPECT_NE(api->create, nullptr);
  EXPECT_NE(api->destroy, nullptr);
  EXPECT_NE(api->set_stream, nullptr);
  EXPECT_NE(api->set_workspace, nullptr);
  EXPECT_NE(api->gemm_ex, nullptr);
  ASSERT_NE(api->get_status_string, nullptr);
  EXPECT_EQ(CublasStatusText(*api, CUBLAS_STATUS_NOT_SUPPORTED),
            "CUBLAS_STATUS_NOT_SUPPORTED: the requested functionality is not supported "
            "(cublasStatus_t 15)");
}

}  // namespace
}  // namespace commd::kernels
