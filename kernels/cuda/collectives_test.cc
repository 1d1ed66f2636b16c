// CUDA collectives: argument checks (run everywhere, nothing is launched), what a launch is
// asked to do (run everywhere, the launch replaced at the CUDA runtime boundary) and, where two
// GPUs with peer access exist, two-rank all-reduces in one process (one rank per device).
#include "kernels/cuda/collectives.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <ostream>
#include <vector>

#include "absl/strings/match.h"
#include "common/symmetric_layout.h"
#include "gtest/gtest.h"
#include "kernels/cuda_plan.h"
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
  EXPECT_TRUE(absl::StrContains(no_scratch.message(),
                                "output being the input in the data region needs scratch of "
                                "count (16) elements"))
      << no_scratch;
  const absl::Status into_peer =
      LaunchAllGather(v, in.data(), v.data[1], 16, DataType::kFloat32, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(into_peer.message(), "output overlaps rank 1")) << into_peer;
  EXPECT_TRUE(absl::IsInvalidArgument(LaunchReduceScatter(v, in.data(), out.data(), 4,
                                                          DataType::kFloat8E4M3, ReduceOp::kSum,
                                                          NanCheck::kOff, nullptr)));
  const absl::Status bool_avg = LaunchReduceScatter(v, in.data(), out.data(), 4, DataType::kBool,
                                                    ReduceOp::kAvg, NanCheck::kOff, nullptr);
  EXPECT_TRUE(absl::StrContains(bool_avg.message(),
                                "reduce op avg is not defined on bool; allowed on bool: sum, "
                                "min, max, product, band, bor, bxor"))
      << bool_avg;
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

// The launch replaced at the CUDA runtime boundary: what each all-reduce placement asks the
// kernel to do.
std::vector<cuda_internal::LaunchArgs>* g_launched = nullptr;
cudaError_t RecordLaunch(const CudaCommView&, const cuda_internal::LaunchArgs& a, cudaStream_t) {
  g_launched->push_back(a);
  return cudaSuccess;
}
cudaError_t NoPreload() { return cudaSuccess; }

class CudaLaunchArgsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_launched = &launched_;
    cuda_internal::SetKernelRuntimeForTesting(&runtime_);
  }
  void TearDown() override {
    cuda_internal::SetKernelRuntimeForTesting(nullptr);
    g_launched = nullptr;
  }
  absl::Status OneShot(const void* in, void* out, void* scratch) {
    return LaunchAllReduce(view_, in, out, 16, DataType::kFloat32, ReduceOp::kSum,
                           Algorithm::kOneShot, NanCheck::kOff, scratch, nullptr);
  }
  const cuda_internal::KernelRuntime runtime_{&RecordLaunch, &NoPreload};
  std::vector<cuda_internal::LaunchArgs> launched_;
  const CudaCommView view_ = FakeView();
};

// Issue #36 fix 3: the input in the data region with a separate output is launched without
// scratch and told to write the output; only an output that is the input goes through scratch.
TEST_F(CudaLaunchArgsTest, OneShotWritesASeparateOutputAndNeedsScratchOnlyInPlace) {
  std::byte* staged = view_.data[0] + 256;
  std::vector<float> out(16), own(16);
  ASSERT_TRUE(OneShot(staged, out.data(), nullptr).ok());
  ASSERT_EQ(launched_.size(), 1u);
  EXPECT_TRUE(launched_[0].in_place);
  EXPECT_FALSE(launched_[0].output_is_input);
  EXPECT_EQ(launched_[0].output, out.data());
  EXPECT_EQ(launched_[0].offset, 256u);
  EXPECT_EQ(launched_[0].scratch, nullptr);

  float scratch[16];
  ASSERT_TRUE(OneShot(staged, staged, scratch).ok());
  ASSERT_EQ(launched_.size(), 2u);
  EXPECT_TRUE(launched_[1].in_place);
  EXPECT_TRUE(launched_[1].output_is_input);
  EXPECT_EQ(launched_[1].scratch, scratch);

  // Input and output the same ordinary buffer: staged by copy-in, written directly.
  ASSERT_TRUE(OneShot(own.data(), own.data(), nullptr).ok());
  ASSERT_EQ(launched_.size(), 3u);
  EXPECT_FALSE(launched_[2].in_place);
  EXPECT_FALSE(launched_[2].output_is_input);

  // An output elsewhere in the data region is still refused: peers read it.
  const absl::Status into_region = OneShot(staged, view_.data[0] + 1024, nullptr);
  EXPECT_TRUE(absl::StrContains(into_region.message(), "output overlaps rank 0")) << into_region;
  EXPECT_EQ(launched_.size(), 3u);
}

// Several ranks on one GPU (issue #36): what the device holds resident of the collective
// kernels, and whether 8 ranks' kernels (1 and 2 streams each) are resident at once at
// kCudaBlocks each, the bound that matters under MPS (docs/gpu-testing.md). One rank's grid
// must fit; the rest is printed for the first run's record.
TEST(CudaResidencyTest, ResidentBlocksOfTheKernelsOnAGpu) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const absl::StatusOr<int> resident = ResidentCollectiveBlocks();
  ASSERT_TRUE(resident.ok()) << resident.status();
  EXPECT_GE(*resident, kCudaBlocks);
  for (int streams : {1, 2}) {
    const ResidentGrid g = GridForSharedDevice(*resident, 8, streams, kCudaBlocks);
    std::printf("BENCH commd resident_blocks %d; 8 ranks x %d stream(s): %d blocks each%s\n",
                *resident, streams, g.blocks,
                g.capped ? " (fewer than the grid: not under MPS)" : "");
  }
}

// Two ranks, one per device, in one process: all-reduce of rank + 1 (3 everywhere) with the
// input at the start of each data region, written over it or to a separate device buffer.
struct TwoGpuCase {
  const char* name;
  Algorithm algorithm;
  bool separate_output;
};

void PrintTo(const TwoGpuCase& c, std::ostream* os) { *os << c.name; }

class TwoGpuAllReduceTest : public ::testing::TestWithParam<TwoGpuCase> {};

TEST_P(TwoGpuAllReduceTest, SumsIntoTheOutput) {
  const TwoGpuCase& c = GetParam();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    GTEST_SKIP() << "needs two CUDA devices (found " << devices << ")";
  }
  int can01 = 0, can10 = 0;
  cudaDeviceCanAccessPeer(&can01, 0, 1);
  cudaDeviceCanAccessPeer(&can10, 1, 0);
  if (!can01 || !can10) GTEST_SKIP() << "devices 0 and 1 lack peer access";
  constexpr int kWorld = 2;
  constexpr size_t kCount = 1 << 16;
  const size_t pad_bytes = SymmetricDataOffset(kWorld) * 8;  // room for kCudaBlocks channels
  std::byte* base[kWorld];
  void* extra[kWorld];  // the separate output, or the in-place one-shot's scratch
  for (int d = 0; d < kWorld; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    cudaDeviceEnablePeerAccess(1 - d, 0);
    void* mem = nullptr;
    ASSERT_EQ(cudaMalloc(&mem, pad_bytes + kCount * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&extra[d], kCount * 4), cudaSuccess);
    base[d] = static_cast<std::byte*>(mem);
    ASSERT_EQ(cudaMemset(base[d], 0, pad_bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(extra[d], 0, kCount * 4), cudaSuccess);
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
    void* out = c.separate_output ? extra[d] : v.data[d];
    void* scratch = c.separate_output ? nullptr : extra[d];
    const absl::Status st =
        LaunchAllReduce(v, v.data[d], out, kCount, DataType::kFloat32, ReduceOp::kSum, c.algorithm,
                        NanCheck::kOff, scratch, nullptr);
    ASSERT_TRUE(st.ok()) << st;
  }
  for (int d = 0; d < kWorld; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> host(kCount);
    const void* out = c.separate_output ? extra[d] : base[d] + pad_bytes;
    ASSERT_EQ(cudaMemcpy(host.data(), out, kCount * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 3.0f) << "device " << d << " " << i;
    cudaFree(base[d]);
    cudaFree(extra[d]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Placements, TwoGpuAllReduceTest,
    ::testing::Values(TwoGpuCase{"TwoShotInPlace", Algorithm::kTwoShot, false},
                      TwoGpuCase{"TwoShotSeparateOutput", Algorithm::kTwoShot, true},
                      TwoGpuCase{"OneShotInPlace", Algorithm::kOneShot, false},
                      TwoGpuCase{"OneShotSeparateOutput", Algorithm::kOneShot, true}),
    [](const ::testing::TestParamInfo<TwoGpuCase>& info) { return info.param.name; });

}  // namespace
}  // namespace commd::kernels
