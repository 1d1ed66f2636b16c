// Recorder's stream-ordered Started / Completed on a control block in process memory: the
// CPU path and the refusal run everywhere; the stream write needs a GPU.
#include "commd/recorder.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "client/src/recorder_impl.h"
#include "common/control_block.h"
#include "common/control_block_admin.h"
#include "common/cuda_driver.h"

#ifdef COMMD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace commd {
namespace {

class RecorderStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(InitControlBlock(block_.get(), kBytes,
                                 {.ring_capacity = kCapacity, .rank = 0, .world_size = 2})
                    .ok());
    auto impl = std::make_unique<Recorder::Impl>();
    auto writer = RingWriter::Attach(block_.get(), kBytes, {.pg_name = "g"});
    ASSERT_TRUE(writer.ok()) << writer.status();
    impl->writer = std::move(*writer);
    impl->block = block_.get();
    impl->block_bytes = kBytes;
    recorder_ = std::make_unique<Recorder>(std::move(impl));
  }
  RecordId Begin() {
    const int64_t dims[] = {1024};
    const TensorDesc t{dims, 1, DataType::kFloat32};
    return recorder_->Begin(CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
  }
  const ControlBlockFixed& fixed() {
    return *reinterpret_cast<const ControlBlockFixed*>(block_.get());
  }
  const RingEntry& entry(const RecordId& id) {
    return reinterpret_cast<const RingEntry*>(block_.get() + kRingOffset)[id.record_id % kCapacity];
  }

  static constexpr uint32_t kCapacity = 16;
  static constexpr size_t kBytes = ControlBlockBytes(kCapacity);
  // Page-aligned, as the mapping the SDK gets from the daemon.
  std::unique_ptr<char, decltype(&std::free)> block_{
      static_cast<char*>(std::aligned_alloc(4096, (kBytes + 4095) / 4096 * 4096)), &std::free};
  std::unique_ptr<Recorder> recorder_;  // after block_: destroyed first
};

TEST_F(RecorderStreamTest, NullStreamWithoutCudaRecordsOnTheCpu) {
  if (ProbeCudaDriver().available) GTEST_SKIP() << "with a driver a null stream is a GPU stream";
  const RecordId first = Begin();
  const RecordId id = Begin();
  ASSERT_EQ(id.collective_seq_id, 2u);
  ASSERT_TRUE(recorder_->Started(id, nullptr).ok());
  EXPECT_EQ(entry(id).state, static_cast<uint8_t>(RecordState::kStarted));
  EXPECT_NE(entry(id).time_started_ns, 0u);
  EXPECT_EQ(fixed().progress.last_started_seq, 2u);
  EXPECT_EQ(fixed().progress.last_completed_seq, 0u);
  ASSERT_TRUE(recorder_->Completed(id, nullptr).ok());
  EXPECT_EQ(entry(id).state, static_cast<uint8_t>(RecordState::kCompleted));
  EXPECT_EQ(fixed().progress.last_completed_seq, 2u);
  EXPECT_EQ(fixed().counters.collectives, 1u);
  EXPECT_EQ(entry(first).state, static_cast<uint8_t>(RecordState::kScheduled));
}

TEST_F(RecorderStreamTest, StreamWithoutCudaIsRefusedAndRecordsNothing) {
  if (ProbeCudaDriver().available) GTEST_SKIP() << "needs a machine without a CUDA driver";
  const RecordId id = Begin();
  void* stream = reinterpret_cast<void*>(0x1234);
  const absl::Status started = recorder_->Started(id, stream);
  EXPECT_EQ(started.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(started.message().find("needs a CUDA build and driver"), std::string::npos) << started;
  const absl::Status completed = recorder_->Completed(id, stream);
  EXPECT_EQ(completed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(entry(id).state, static_cast<uint8_t>(RecordState::kScheduled));
  EXPECT_EQ(entry(id).time_started_ns, 0u);
  EXPECT_EQ(entry(id).time_completed_ns, 0u);
  EXPECT_EQ(fixed().progress.last_started_seq, 0u);
  EXPECT_EQ(fixed().progress.last_completed_seq, 0u);
  EXPECT_EQ(fixed().counters.collectives, 0u);
}

TEST_F(RecorderStreamTest, StreamWritesTheProgressWordsOnAGpu) {
  if (!ProbeCudaDriver().available) {
    GTEST_SKIP() << "needs a CUDA device: " << ProbeCudaDriver().summary;
  }
#ifdef COMMD_HAVE_CUDA
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const RecordId id = Begin();
  ASSERT_TRUE(recorder_->Started(id, stream).ok());
  ASSERT_TRUE(recorder_->Completed(id, stream).ok());
  // The CPU wrote the entry at enqueue time; the words come from the stream.
  EXPECT_EQ(entry(id).state, static_cast<uint8_t>(RecordState::kCompleted));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(__atomic_load_n(&fixed().progress.last_started_seq, __ATOMIC_ACQUIRE), 1u);
  EXPECT_EQ(__atomic_load_n(&fixed().progress.last_completed_seq, __ATOMIC_ACQUIRE), 1u);
  const RecordId next = Begin();
  ASSERT_TRUE(recorder_->Started(next, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(__atomic_load_n(&fixed().progress.last_started_seq, __ATOMIC_ACQUIRE), 2u);
  EXPECT_EQ(__atomic_load_n(&fixed().progress.last_completed_seq, __ATOMIC_ACQUIRE), 1u);
  cudaStreamDestroy(stream);
#endif
}

}  // namespace
}  // namespace commd
