// CUDA collectives: argument checks (run everywhere, nothing is launched) and, where two GPUs
// with peer access exist, a two-rank all-reduce in one process (one rank per device).
#include "kernels/cuda/collectives.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "common/symmetric_layout.h"
#include "gtest/gtest.h"
#include "kernels/signal_layout.h"

namespace commd::kernels {
namespace {

// Fake addresses are fine: validation never dereferences them.
CudaCommView FakeView() {
  CudaCommView v;
  v.rank = 0;
  v.world_size = 2;
  v.data[0] = reinterpret_cast<std::byte*>(uintptr_t{1} << 40);
  v.data[1] = reinterpret_cast<std::byte*>(uintptr_t{2} << 40);
  v.pads[0] = reinterpret_cast<uint32_t*>(uintptr_t{3} << 40);
  v.pads[1] = reinterpret_cast<uint32_t*>(uintptr_t{4} << 40);
  v.data_bytes = 4096;
  v.pad_slots = kCudaBlocks * 2;
  return v;
}

TEST(CudaValidationTest, RejectsBadViewsAndArguments) {
  CudaCommView v = FakeView();
  v.world_size = kCudaMaxWorldSize + 1;
  EXPECT_TRUE(absl::IsInvalidArgument(LaunchBarrier(v, nullptr)));
  v = FakeView();
  v.rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(LaunchBarrier(v, nullptr)));
  v = FakeView();
  v.pad_slots = 31;
  const absl::Status small_pad = LaunchBarrier(v, nullptr);
  EXPECT_TRUE(absl::StrContains(small_pad.message(), "need at least 32")) << small_pad;
  v = FakeView();
  std::vector<float> in(2048), out(2048);
  const absl::Status too_big =
      LaunchAllReduce(v, in.data(), out.data(), 1025, DataType::kFloat32, ReduceOp::kSum,
                      Algorithm::kTwoShot, NanCheck::kOff, nullptr, nullptr);
  EXPECT_TRUE(absl::StrContains(too_big.message(), "4100 bytes")) << too_big;
  const absl::Status no_scratch =
      LaunchAllReduce(v, v.data[0], v.data[0], 16, DataType::kFloat32, ReduceOp::kSum,
                      Algorithm::kOneShot, NanCheck::kOff, nullptr, nullptr);
  EXPECT_TRUE(absl::StrContains(no_scratch.message(), "scratch")) << no_scratch;
  const absl::Status into_peer =
      LaunchAllGather(v, in.data(), v.data[1], 16, DataType::kFloat32, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(into_peer.message(), "output overlaps rank 1")) << into_peer;
  EXPECT_TRUE(absl::IsInvalidArgument(LaunchReduceScatter(v, in.data(), out.data(), 4,
                                                          static_cast<DataType>(8), ReduceOp::kSum,
                                                          NanCheck::kOff, nullptr)));
}

TEST(CudaValidationTest, BroadcastAndAllToAll) {
  const CudaCommView v = FakeView();
  std::vector<float> in(4096), out(4096);
  const absl::Status bad_root =
      LaunchBroadcast(v, in.data(), 16, DataType::kFloat32, 2, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(bad_root));
  EXPECT_TRUE(absl::StrContains(bad_root.message(), "root 2 is out of range [0, 1]")) << bad_root;
  EXPECT_TRUE(absl::IsInvalidArgument(
      LaunchBroadcast(v, in.data(), 16, DataType::kFloat32, -1, NanCheck::kOff, nullptr)));
  const absl::Status too_big =
      LaunchBroadcast(v, in.data(), 1025, DataType::kFloat32, 0, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(too_big.message(), "4100 bytes")) << too_big;
  const absl::Status in_peer =
      LaunchBroadcast(v, v.data[1], 16, DataType::kFloat32, 0, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(in_peer.message(), "input overlaps rank 1")) << in_peer;
  // All-to-all stages world_size x count: 513 floats x 2 ranks = 4104 bytes.
  const absl::Status a2a_big =
      LaunchAllToAll(v, in.data(), out.data(), 513, DataType::kFloat32, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(a2a_big.message(), "4104 bytes")) << a2a_big;
  const absl::Status overflow = LaunchAllToAll(v, in.data(), out.data(), SIZE_MAX / 4,
                                               DataType::kFloat32, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(overflow.message(), "overflows")) << overflow;
  const absl::Status into_own =
      LaunchAllToAll(v, v.data[0], v.data[0], 16, DataType::kFloat32, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(into_own.message(), "output overlaps rank 0")) << into_own;
}

TEST(CudaCollectivesTest, TwoGpuAllReduce) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    GTEST_SKIP() << "needs two CUDA devices (found " << devices << ")";
  }
  int can01 = 0, can10 = 0;
  cudaDeviceCanAccessPeer(&can01, 0, 1);
  cudaDeviceCanAccessPeer(&can10, 1, 0);
  if (!can01 || !can10) GTEST_SKIP() << "devices 0 and 1 lack peer access";
  constexpr int kWorld = 2;
  constexpr size_t kCount = 1 << 20;
  const size_t pad_bytes = SymmetricDataOffset(kWorld) * 8;  // room for kCudaBlocks channels
  std::byte* base[kWorld];
  for (int d = 0; d < kWorld; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    cudaDeviceEnablePeerAccess(1 - d, 0);
    void* mem = nullptr;
    ASSERT_EQ(cudaMalloc(&mem, pad_bytes + kCount * 4), cudaSuccess);
    base[d] = static_cast<std::byte*>(mem);
    ASSERT_EQ(cudaMemset(base[d], 0, pad_bytes), cudaSuccess);
    std::vector<float> host(kCount, static_cast<float>(d + 1));
    ASSERT_EQ(cudaMemcpy(base[d] + pad_bytes, host.data(), kCount * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  for (int d = 0; d < kWorld; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    CudaCommView v;
    v.rank = d;
    v.world_size = kWorld;
    for (int p = 0; p < kWorld; ++p) {
      v.pads[p] = reinterpret_cast<uint32_t*>(base[p]);
      v.data[p] = base[p] + pad_bytes;
    }
    v.data_bytes = kCount * 4;
    v.pad_slots = pad_bytes / 4;
    ASSERT_TRUE(LaunchAllReduce(v, v.data[d], v.data[d], kCount, DataType::kFloat32, ReduceOp::kSum,
                                Algorithm::kTwoShot, NanCheck::kOff, nullptr, nullptr)
                    .ok());
  }
  for (int d = 0; d < kWorld; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> host(kCount);
    ASSERT_EQ(cudaMemcpy(host.data(), base[d] + pad_bytes, kCount * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 3.0f) << "device " << d << " " << i;
    cudaFree(base[d]);
  }
}

}  // namespace
}  // namespace commd::kernels
