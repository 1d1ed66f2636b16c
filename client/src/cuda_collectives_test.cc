// The parts of the SDK's CUDA collectives that run without a GPU: the deferred errors the
// device-side waits leave, and the group state refusing to exist without a driver or device.
// (The collectives themselves on GPUs: tests/integration CollectiveTest.CudaCollectivesOnTwoGpus.)
#include "client/src/cuda_collectives.h"

#include "common/cuda_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd {
namespace {

using ::testing::HasSubstr;

TEST(CudaCollectivesTest, DeviceWaitErrorNamesThePeerAndTheCode) {
  EXPECT_TRUE(DeviceWaitError(0, "tp").ok());
  const absl::Status aborted = DeviceWaitError(1u << 16 | 3, "tp");
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(aborted.message(), HasSubstr("group tp: an earlier collective on CUDA buffers was "
                                           "aborted while waiting for rank 3"));
  EXPECT_THAT(aborted.message(), HasSubstr("unusable"));
  const absl::Status timed_out = DeviceWaitError(2u << 16 | 15, "tp");
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed_out.message(), HasSubstr("timed out waiting for rank 15"));
  const absl::Status unknown = DeviceWaitError(9u << 16 | 1, "tp");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(unknown.message(), HasSubstr("0x90001 has unknown code 9"));
}

TEST(CudaCollectivesTest, GroupStateWithoutADeviceSaysWhy) {
  if (ProbeCudaDriver().available) GTEST_SKIP() << "a CUDA device is present";
  Recorder::Impl recorder;
  auto state = CreateCudaGroupState(0, &recorder);
  ASSERT_FALSE(state.ok());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(state.status().message(),
              HasSubstr("collectives on CUDA buffers of device cuda:0 need a CUDA driver"));
  EXPECT_THAT(state.status().message(), HasSubstr(ProbeCudaDriver().summary));
}

TEST(CudaCollectivesTest, GroupStateOnAGpu) {
  const CudaDriverInfo& cuda = ProbeCudaDriver();
  if (!cuda.available) GTEST_SKIP() << "needs a CUDA device (" << cuda.summary << ")";
  Recorder::Impl recorder;
  auto state = CreateCudaGroupState(0, &recorder);
  ASSERT_TRUE(state.ok()) << state.status();
  state->reset();  // frees the pinned words, releases the primary context
  auto beyond = CreateCudaGroupState(cuda.device_count, &recorder);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace commd
