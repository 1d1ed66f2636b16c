// The cuBLAS table (kernels/cuda/cublas_api.h): what a missing or wrong library is told as,
// and that the toolkit's real cuBLAS resolves every entry point (dlopen needs no GPU).
#include "kernels/cuda/cublas_api.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

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
  for (const char* name : kCublasLibraries) {
    if (std::filesystem::exists(dir + "/" + name)) {
      library = dir + "/" + name;
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
  EXPECT_NE(api->gemm_ex, nullptr);
  ASSERT_NE(api->get_status_string, nullptr);
  EXPECT_EQ(CublasStatusText(*api, CUBLAS_STATUS_NOT_SUPPORTED),
            "CUBLAS_STATUS_NOT_SUPPORTED: the requested functionality is not supported "
            "(cublasStatus_t 15)");
}

}  // namespace
}  // namespace commd::kernels
