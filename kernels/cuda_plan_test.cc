// The CUDA collectives' host-decidable logic (kernels/cuda_plan.h), over world sizes 1 to 16
// and element counts around every boundary of the split (ranks, blocks, vector packs).
#include "kernels/cuda_plan.h"

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

constexpr int kBlocks = 16;  // kCudaBlocks (kernels/cuda/collectives.h)

// Counts around each boundary: 0, a world's worth, a block grid's worth and a vector's worth
// of elements per block, each +-1, plus a large odd count (bf16 vocab 32001).
std::vector<size_t> CountsFor(int world) {
  const size_t w = static_cast<size_t>(world);
  std::set<size_t> counts = {0, 1, 2, 7, 8, 9, 32001};
  for (size_t edge : {w, w * kBlocks, w * kBlocks * 8, w * kBlocks * 8 * 3}) {
    for (size_t d : {size_t{0}, size_t{1}, size_t{2}}) {
      counts.insert(edge + d);
      if (edge >= d) counts.insert(edge - d);
    }
  }
  return {counts.begin(), counts.end()};
}

// Every element of [0, count) belongs to exactly one (part, block), in order, and parts of
// blocks differ by at most one element: the split loses and duplicates nothing.
TEST(CudaPlanTest, BlockPartsTileEveryCountForWorldsOneToSixteen) {
  for (int world = 1; world <= 16; ++world) {
    for (size_t count : CountsFor(world)) {
      size_t next = 0;
      for (int part = 0; part < world; ++part) {
        const ChunkRange chunk = Chunk(count, world, part);
        size_t smallest = SIZE_MAX, largest = 0;
        for (int b = 0; b < kBlocks; ++b) {
          const ChunkRange r = BlockPart(count, world, part, kBlocks, b);
          ASSERT_EQ(r.begin, next)
              << "world " << world << " count " << count << " part " << part << " block " << b;
          ASSERT_LE(r.begin, r.end);
          next = r.end;
          smallest = std::min(smallest, r.end - r.begin);
          largest = std::max(largest, r.end - r.begin);
        }
        ASSERT_EQ(next, chunk.end) << "world " << world << " count " << count;
        ASSERT_LE(largest - smallest, 1u) << "world " << world << " count " << count;
      }
      ASSERT_EQ(next, count) << "world " << world << " count " << count;
    }
  }
}

// The vector body starts at a multiple of the pack and is a whole number of packs; head and
// tail are scalars; together they are the range. Without vectors everything is scalar.
TEST(CudaPlanTest, VectorSplitCoversTheRangeWithAlignedPacks) {
  for (size_t pack : {size_t{4}, size_t{8}, size_t{2}}) {  // fp32/int32, fp16/bf16, int64
    for (int world = 1; world <= 16; ++world) {
      for (size_t count : CountsFor(world)) {
        for (int b = 0; b < kBlocks; ++b) {
          const ChunkRange r = BlockPart(count, world, world - 1, kBlocks, b);
          const VectorSplit s = SplitForVectors(r.begin, r.end, pack, true);
          ASSERT_LE(r.begin, s.head);
          ASSERT_LE(s.head, s.body_end);
          ASSERT_LE(s.body_end, r.end);
          if (s.body_end > s.head) {
            ASSERT_EQ(s.head % pack, 0u);
          }
          ASSERT_EQ((s.body_end - s.head) % pack, 0u);
          ASSERT_LT(s.head - r.begin, pack);
          ASSERT_LT(r.end - s.body_end, pack);
          const VectorSplit off = SplitForVectors(r.begin, r.end, pack, false);
          ASSERT_EQ(off.head, r.end);
          ASSERT_EQ(off.body_end, r.end);
        }
      }
    }
  }
}

// Issue #19 fix 3: bf16 vocab 32001 (count * 2 bytes is not a multiple of 16) must not use
// vectors for all-gather/reduce-scatter/all-to-all chunks, though every base is aligned.
TEST(CudaPlanTest, VectorsAlignedChecksBasesOffsetAndChunkStride) {
  alignas(16) static std::byte memory[256];
  const void* aligned[] = {memory, memory + 16, memory + 64};
  EXPECT_TRUE(VectorsAligned(aligned, 3, 0, 0));
  EXPECT_TRUE(VectorsAligned(aligned, 3, 32, 32000 * 2));
  EXPECT_FALSE(VectorsAligned(aligned, 3, 0, 32001 * 2));  // bf16 vocab
  EXPECT_FALSE(VectorsAligned(aligned, 3, 0, 1001 * 4));   // fp32 count 1001
  EXPECT_TRUE(VectorsAligned(aligned, 3, 0, 1004 * 4));
  EXPECT_FALSE(VectorsAligned(aligned, 3, 8, 0));  // staging offset
  const void* one_off[] = {memory, memory + 8};
  EXPECT_FALSE(VectorsAligned(one_off, 2, 0, 0));
  EXPECT_TRUE(VectorsAligned(one_off, 1, 0, 0));  // only the bases the launch uses count
  for (size_t count = 1; count < 64; ++count) {
    for (size_t size : {size_t{2}, size_t{4}, size_t{8}}) {
      EXPECT_EQ(VectorsAligned(aligned, 3, 0, count * size), count * size % 16 == 0)
          << count << " x " << size;
    }
  }
}

// Issue #19 fix 4: two streams never share a scratch; one stream reuses its own; growing
// keeps the stream's slot; beyond kMaxStreams the least recently used stream is evicted.
TEST(CudaPlanTest, ScratchIsPerStream) {
  ScratchTable t;
  const uintptr_t s1 = 0x1000, s2 = 0x2000;
  ScratchTable::Choice c = t.Choose(s1, 8192);
  ASSERT_EQ(c.action, ScratchTable::Action::kAllocate);
  EXPECT_EQ(c.bytes, ScratchTable::kGranule);
  t.Commit(c.slot, s1, c.bytes);
  const int slot1 = c.slot;
  c = t.Choose(s2, 8192);
  ASSERT_EQ(c.action, ScratchTable::Action::kAllocate);
  EXPECT_NE(c.slot, slot1);
  t.Commit(c.slot, s2, c.bytes);
  c = t.Choose(s1, 4096);
  EXPECT_EQ(c.action, ScratchTable::Action::kReuse);
  EXPECT_EQ(c.slot, slot1);
  c = t.Choose(s1, ScratchTable::kGranule + 1);
  EXPECT_EQ(c.action, ScratchTable::Action::kGrow);
  EXPECT_EQ(c.slot, slot1);
  EXPECT_EQ(c.bytes, 2 * ScratchTable::kGranule);
  t.Commit(c.slot, s1, c.bytes);
  EXPECT_EQ(t.Find(s1), slot1);
  EXPECT_EQ(t.bytes(slot1), 2 * ScratchTable::kGranule);
  // Fill every slot; s2 was used least recently, then the streams in order.
  for (uintptr_t s = 3; s <= ScratchTable::kMaxStreams; ++s) {
    c = t.Choose(s << 12, 1);
    ASSERT_EQ(c.action, ScratchTable::Action::kAllocate) << s;
    t.Commit(c.slot, s << 12, c.bytes);
  }
  std::set<int> slots;
  for (uintptr_t s = 1; s <= ScratchTable::kMaxStreams; ++s) slots.insert(t.Find(s << 12));
  EXPECT_EQ(slots.size(), static_cast<size_t>(ScratchTable::kMaxStreams));
  c = t.Choose(0x99000, 1);
  ASSERT_EQ(c.action, ScratchTable::Action::kEvict);
  EXPECT_EQ(c.evicted, s2);
  EXPECT_EQ(c.slot, t.Find(s2));
}

// A slot stays in use until released, however many calls come after (issue #19: a NaN slot
// must not be reused while a failed call's kernels may still write it).
TEST(CudaPlanTest, CounterSlotsNeverHandOutASlotInUse) {
  CounterSlots slots(4);
  EXPECT_EQ(slots.Take(), 0);
  EXPECT_EQ(slots.Take(), 1);
  EXPECT_EQ(slots.Take(), 2);
  slots.Release(1);  // retired out of order: 0 stays in use (a partial launch)
  EXPECT_EQ(slots.Take(), 3);
  EXPECT_EQ(slots.Take(), 1);
  EXPECT_EQ(slots.Take(), -1);
  for (int i = 0; i < 100; ++i) {
    slots.Release(2);
    EXPECT_EQ(slots.Take(), 2);
    EXPECT_TRUE(slots.in_use(0));
  }
}

// Issue #19 fix 7: a call refused by its argument checks before any kernel leaves the group
// usable; a launch failing, or any failure once a kernel is queued, does not.
TEST(CudaPlanTest, WhichLaunchFailuresDesynchroniseTheGroup) {
  EXPECT_FALSE(LaunchFailureDesyncs(0, absl::OkStatus()));
  EXPECT_FALSE(LaunchFailureDesyncs(0, absl::InvalidArgumentError("count")));
  EXPECT_FALSE(LaunchFailureDesyncs(0, absl::UnimplementedError("no kernel")));
  EXPECT_TRUE(LaunchFailureDesyncs(0, absl::InternalError("cudaErrorLaunchOutOfResources")));
  EXPECT_TRUE(LaunchFailureDesyncs(1, absl::InvalidArgumentError("tensor 1")));
  EXPECT_TRUE(LaunchFailureDesyncs(3, absl::InternalError("cuEventRecord")));
}

// Every kernel on a shared device resident at once: the sum of the grids never exceeds what the
// device holds, the grid is the largest that does (up to the cap), and 0 says "does not fit".
TEST(CudaPlanTest, GridsOfRanksSharingADeviceAreResidentTogether) {
  // H200: 132 SMs; 16 blocks x 512 threads, 2 resident per SM -> 264.
  EXPECT_EQ(GridForSharedDevice(264, 1, 1, 16).blocks, 16);
  EXPECT_FALSE(GridForSharedDevice(264, 8, 1, 16).capped);   // 8 x 16 = 128 <= 264
  EXPECT_EQ(GridForSharedDevice(264, 8, 2, 16).blocks, 16);  // two streams: 256 <= 264
  const ResidentGrid crowded = GridForSharedDevice(264, 8, 4, 16);
  EXPECT_EQ(crowded.kernels, 32);
  EXPECT_EQ(crowded.blocks, 8);
  EXPECT_TRUE(crowded.capped);
  // A small GPU (40 SMs, 1 resident block each) with 8 ranks: 5 blocks each.
  EXPECT_EQ(GridForSharedDevice(40, 8, 1, 16).blocks, 5);
  EXPECT_EQ(GridForSharedDevice(7, 8, 1, 16).blocks, 0);  // not one block each
  EXPECT_EQ(GridForSharedDevice(0, 1, 1, 16).blocks, 0);
  EXPECT_EQ(GridForSharedDevice(264, 0, 1, 16).blocks, 0);
  for (int resident = 1; resident <= 300; resident += 7) {
    for (int ranks = 1; ranks <= 16; ++ranks) {
      for (int k = 1; k <= 3; ++k) {
        const ResidentGrid g = GridForSharedDevice(resident, ranks, k, 16);
        ASSERT_LE(g.blocks * g.kernels, resident) << resident << " " << ranks << " " << k;
        ASSERT_LE(g.blocks, 16);
        if (g.blocks < 16) {
          ASSERT_GT((g.blocks + 1) * g.kernels, resident);
        }
        EXPECT_EQ(g.capped, g.blocks < 16);
      }
    }
  }
  EXPECT_EQ(MaxRanksOnDevice(264, 16, 1), 16);
  EXPECT_EQ(MaxRanksOnDevice(264, 16, 2), 8);
  EXPECT_EQ(MaxRanksOnDevice(100, 16, 1), 6);
  EXPECT_EQ(MaxRanksOnDevice(100, 0, 1), 0);
}

}  // namespace
}  // namespace commd::kernels
