// The allocation table's per-uid shares (limits.per_uid): counted per device kind, over every
// job of a uid, on what the backend actually holds, and exactly under concurrent callers.
// Host memory is the real memfd backend; GPU memory is a fake (no GPU on test machines).
#include "daemon/memory/allocation_table.h"

#include <atomic>
#include <thread>
#include <vector>

#include "daemon/memory/host/memory_backend.h"
#include "gtest/gtest.h"

namespace commd::memory {
namespace {

constexpr uint64_t kGranularity = 2 << 20;

// Stands in for a GPU: hands out blocks rounded to the 2 MiB granularity cuMem uses.
class FakeGpuBackend final : public MemoryBackend {
 public:
  absl::string_view name() const override { return "cuda"; }
  absl::StatusOr<MemoryBlock> Allocate(const Device& device, size_t bytes,
                                       absl::string_view) override {
    MemoryBlock block;
    block.device = device;
    block.bytes = (bytes + kGranularity - 1) / kGranularity * kGranularity;
    block.handle = ++next_;
    return block;
  }
  absl::StatusOr<ExportedMemory> Export(const MemoryBlock&) override {
    return absl::UnimplementedError("fake");
  }
  void Release(MemoryBlock) override {}

 private:
  std::atomic<uint64_t> next_{0};
};

v1::DaemonConfig Config() {
  v1::DaemonConfig c;
  v1::LimitsConfig& l = *c.mutable_limits();
  l.set_max_allocations_per_session(1000);
  l.set_max_bytes_per_job(uint64_t{1} << 40);
  l.set_max_allocation_bytes(uint64_t{1} << 30);
  v1::PerUidLimits& u = *l.mutable_per_uid();
  u.set_allocations(20);
  u.set_host_bytes(1 << 20);
  u.set_cuda_bytes(8 << 20);
  u.set_control_blocks(2);
  u.set_persistent_buffers(3);
  u.set_persistent_bytes(64 << 10);
  c.mutable_session()->set_import_token_ttl_ms(60000);
  return c;
}

class AllocationTableTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::shared_ptr<const Allocation>> Alloc(uid_t uid, const std::string& job,
                                                          const Device& device, size_t bytes,
                                                          v1::Lifetime lifetime = v1::SESSION,
                                                          Purpose purpose = Purpose::kBuffer) {
    return table_.Allocate({uid, job, ""}, device, bytes, "test", lifetime, purpose);
  }

  prometheus::Registry registry_;
  AllocationTable table_{std::make_unique<HostMemoryBackend>(), std::make_unique<FakeGpuBackend>(),
                         Config(), &registry_};
};

// A client's device_uuid: a hostile length is refused with a bounded echo, not compared.
TEST_F(AllocationTableTest, OverlongDeviceUuidIsRefusedWithABoundedEcho) {
  const std::string uuid(1 << 20, 'x');
  auto d = table_.ResolveDevice("cuda:0", uuid);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  EXPECT_NE(d.status().message().find("allowed at most 64 bytes"), absl::string_view::npos)
      << d.status();
  EXPECT_LT(d.status().message().size(), 200u);
  EXPECT_TRUE(table_.ResolveDevice("host", "").ok());
}

TEST_F(AllocationTableTest, BytesAreCountedPerDeviceKindOverTheUidsJobs) {
  // 3 x 2 MiB of GPU memory in two jobs, then 2 MiB more would pass 8 MiB... with 6 held.
  ASSERT_TRUE(Alloc(1001, "a", Device::Cuda(0), 2 << 20).ok());
  ASSERT_TRUE(Alloc(1001, "b", Device::Cuda(1), 2 << 20).ok());
  // 1 byte on a GPU holds a whole 2 MiB granule, and is counted so.
  auto small = Alloc(1001, "c", Device::Cuda(0), 1);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(table_.uid_use(1001).cuda_bytes, uint64_t{6} << 20);
  const auto over = Alloc(1001, "d", Device::Cuda(0), 3 << 20);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "uid 1001 holds 6 MiB of its 8 MiB of GPU memory; 3 MiB more would exceed it "
            "(limits.per_uid.cuda_bytes)");
  // Host memory is another kind, with its own share; another uid has all of its own.
  EXPECT_TRUE(Alloc(1001, "a", Device::Host(), 512 << 10).ok());
  EXPECT_TRUE(Alloc(1002, "a", Device::Cuda(0), 8 << 20).ok());
  const auto host_over = Alloc(1001, "e", Device::Host(), 600 << 10);
  EXPECT_EQ(host_over.status().message(),
            "uid 1001 holds 512 KiB of its 1 MiB of host memory; 600 KiB more would exceed it "
            "(limits.per_uid.host_bytes)");
  // Releasing gives the share back.
  table_.Release((*small)->id);
  EXPECT_TRUE(Alloc(1001, "d", Device::Cuda(0), 3 << 20).ok());
  EXPECT_EQ(table_.uid_use(1001).cuda_bytes, uint64_t{8} << 20);
}

TEST_F(AllocationTableTest, ControlBlocksAndPersistentBuffersHaveShares) {
  ASSERT_TRUE(Alloc(1001, "a", Device::Host(), 4096, v1::SESSION, Purpose::kControlBlock).ok());
  ASSERT_TRUE(Alloc(1001, "b", Device::Host(), 4096, v1::SESSION, Purpose::kControlBlock).ok());
  EXPECT_EQ(Alloc(1001, "c", Device::Host(), 4096, v1::SESSION, Purpose::kControlBlock)
                .status()
                .message(),
            "uid 1001 holds 2 of its 2 control blocks (limits.per_uid.control_blocks)");
  // Ordinary buffers of the same uid are not control blocks.
  EXPECT_TRUE(Alloc(1001, "c", Device::Host(), 4096).ok());
  for (const char* job : {"a", "b", "c"}) {
    ASSERT_TRUE(Alloc(1001, job, Device::Host(), 4096, v1::PERSISTENT).ok()) << job;
  }
  EXPECT_EQ(Alloc(1001, "d", Device::Host(), 4096, v1::PERSISTENT).status().message(),
            "uid 1001 holds 3 of its 3 persistent buffers (limits.per_uid.persistent_buffers)");
  EXPECT_EQ(Alloc(1002, "a", Device::Host(), 65 << 10, v1::PERSISTENT).status().message(),
            "uid 1002 holds 0 bytes of its 64 KiB in persistent buffers; 65 KiB more would exceed "
            "it (limits.per_uid.persistent_bytes)");
  const AllocationTable::UidUse use = table_.uid_use(1001);
  EXPECT_EQ(use.allocations, 6u);
  EXPECT_EQ(use.control_blocks, 2u);
  EXPECT_EQ(use.persistent_buffers, 3u);
  EXPECT_EQ(use.host_bytes, 6u * 4096);
  EXPECT_EQ(table_.uid_use(1002).allocations, 0u);
}

TEST_F(AllocationTableTest, ConcurrentCallersNeverPassTheCountTogether) {
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        if (Alloc(1001, "job" + std::to_string(t), Device::Cuda(0), 1).ok()) ++granted;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // 8 MiB of 2 MiB granules: 4, whatever the interleaving; the count share (20) is not hit.
  EXPECT_EQ(granted.load(), 4);
  EXPECT_EQ(table_.uid_use(1001).allocations, 4u);
  EXPECT_EQ(table_.count(), 4u);
}

}  // namespace
}  // namespace commd::memory
