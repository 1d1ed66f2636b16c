#include "daemon/memory/memory_backend.h"

#include "common/cuda_driver.h"
#include "gtest/gtest.h"

namespace commd::memory {
namespace {

// Without a driver (this project's machines) the backend says so, with the reason, and the
// daemon runs on host memory only.
TEST(CudaMemoryBackendTest, UnavailableWithoutADriverSaysWhy) {
  if (ProbeCudaDriver().available) GTEST_SKIP() << "a CUDA device is present";
  auto backend = CreateCudaMemoryBackend();
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(backend.status().message().empty());
  EXPECT_EQ(backend.status().message(), ProbeCudaDriver().summary);
}

TEST(CudaMemoryBackendTest, AllocatesExportsAndReleasesOnAGpu) {
  if (!ProbeCudaDriver().available) GTEST_SKIP() << "needs a CUDA device";
  auto backend = CreateCudaMemoryBackend();
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto block = (*backend)->Allocate(Device::Cuda(0), 1 << 20, "test");
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_GE(block->bytes, size_t{1} << 20);
  auto exported = (*backend)->Export(*block);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_TRUE(exported->fd.valid() || !exported->opaque_handle.empty());
  auto host = (*backend)->Allocate(Device::Host(), 4096, "x");
  EXPECT_EQ(host.status().code(), absl::StatusCode::kInvalidArgument);
  (*backend)->Release(*std::move(block));
}

}  // namespace
}  // namespace commd::memory
