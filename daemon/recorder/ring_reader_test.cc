#include "daemon/recorder/ring_reader.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/recorder/ring_test_util.h"

namespace commd {
namespace {

using testing::RecordMix;
using testing::TestBlock;

RingSnapshot MustRead(TestBlock& b, const RingReadOptions& options = {}) {
  auto s = ReadControlBlock(b.base(), b.bytes, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : RingSnapshot{};
}

TEST(RingReader, RoundTripsEveryField) {
  TestBlock b(16, /*rank=*/0, /*world_size=*/2, /*global_rank=*/5);
  auto w = b.Writer();
  RecordMix(*w, 10);
  RingSnapshot s = MustRead(b, {.expected_capacity = 16});
  EXPECT_EQ(s.ring_capacity, 16u);
  EXPECT_EQ(s.global_rank, 5);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.created_ns, 42u);
  EXPECT_EQ(s.invalid_entries, 0u);
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_EQ(s.next_record_id, 10u);
  ASSERT_EQ(s.entries.size(), 10u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(s.entries[i].record_id, i);

  const RecordedEntry& ar = s.entries[0];
  EXPECT_EQ(ar.op, CollectiveOp::kAllReduce);
  EXPECT_EQ(ar.pg_name, "0");
  EXPECT_EQ(ar.pg_desc, "default_pg");
  EXPECT_EQ(ar.state, RecordState::kCompleted);
  EXPECT_TRUE(ar.retired);
  EXPECT_EQ(ar.input_sizes, (std::vector<std::vector<int64_t>>{{16}}));
  EXPECT_EQ(ar.input_dtypes, std::vector<DataType>{DataType::kFloat32});
  EXPECT_EQ(ar.timeout_ms, 600000u);
  EXPECT_EQ(ar.bytes, 64u);
  ASSERT_TRUE(ar.duration_ms.has_value());
  EXPECT_DOUBLE_EQ(*ar.duration_ms, 0.001);  // fake clock: 1000 ns per call
  EXPECT_FALSE(ar.time_discovered_started_ns.has_value());

  const RecordedEntry& ag = s.entries[1];
  EXPECT_EQ(ag.state, RecordState::kStarted);
  EXPECT_EQ(ag.output_sizes, (std::vector<std::vector<int64_t>>{{64}}));
  EXPECT_FALSE(ag.duration_ms.has_value());
  const RecordedEntry& send = s.entries[2];
  EXPECT_TRUE(send.is_p2p);
  EXPECT_EQ(send.peer, 1);
  EXPECT_EQ(send.p2p_seq_id, 1u);
  EXPECT_EQ(send.collective_seq_id, 2u);
  EXPECT_EQ(s.entries[3].op, CollectiveOp::kRecv);
  const RecordedEntry& rs = s.entries[4];
  EXPECT_TRUE(rs.nan_found);
  EXPECT_TRUE(rs.retired);
  EXPECT_EQ(rs.state, RecordState::kScheduled);

  EXPECT_EQ(s.last_enqueued_seq, 6u);  // 6 collectives among 10 entries
  EXPECT_EQ(s.last_completed_seq, 4u);
  EXPECT_EQ(s.collectives, 2u);
  EXPECT_EQ(s.per_op[uint32_t(CollectiveOp::kAllReduce)], 2u);
  EXPECT_EQ(s.nans_found, 2u);
  EXPECT_EQ(s.abandoned, 2u);
  EXPECT_GT(s.heartbeat_ns, 0u);
}

TEST(RingReader, KeepsNewestEntriesAfterWrap) {
  TestBlock b(4);
  auto w = b.Writer();
  RecordMix(*w, 11);
  RingSnapshot s = MustRead(b);
  EXPECT_EQ(s.next_record_id, 11u);
  EXPECT_EQ(s.dropped, 7u);
  ASSERT_EQ(s.entries.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(s.entries[i].record_id, 7 + i);
  EXPECT_EQ(s.entries[3].input_sizes[0][0], 16 * 11);
}

TEST(RingReader, HeaderOnlyRead) {
  TestBlock b(4);
  RecordMix(*b.Writer(), 3);
  RingSnapshot s = MustRead(b, {.include_entries = false});
  EXPECT_TRUE(s.entries.empty());
  EXPECT_EQ(s.last_enqueued_seq, 2u);
}

TEST(RingReader, AbortWordIsReported) {
  TestBlock b(4);
  ASSERT_TRUE(RequestAbort(b.base(), b.bytes, AbortReason::kMismatch, "sizes differ", 77));
  RingSnapshot s = MustRead(b);
  EXPECT_EQ(s.abort_reason, uint32_t(AbortReason::kMismatch));
  EXPECT_EQ(s.abort_text, "sizes differ");
  EXPECT_EQ(s.abort_time_ns, 77u);
}

TEST(StampDiscoveries, StampsOnceAndOnlyItsOwnRecord) {
  TestBlock b(4);
  auto w = b.Writer();
  RecordMix(*w, 3);  // completed, started, scheduled
  RingSnapshot s = MustRead(b);
  ASSERT_TRUE(StampDiscoveries(b.base(), b.bytes, 500, &s).ok());
  EXPECT_EQ(s.entries[0].time_discovered_started_ns, 500u);
  EXPECT_EQ(s.entries[0].time_discovered_completed_ns, 500u);
  EXPECT_EQ(s.entries[1].time_discovered_started_ns, 500u);
  EXPECT_FALSE(s.entries[1].time_discovered_completed_ns.has_value());
  EXPECT_FALSE(s.entries[2].time_discovered_started_ns.has_value());

  // Entry 1 completes; a later poll stamps its completion and keeps the first stamps.
  const int64_t n = 1;
  TensorDesc t{.dims = &n, .ndim = 1};
  w->Completed(
      {.record_id = 1, .collective_seq_id = 2, .bytes = 4, .op = CollectiveOp::kAllGather});
  s = MustRead(b);
  EXPECT_EQ(s.entries[1].time_discovered_started_ns, 500u);  // read back from shared memory
  ASSERT_TRUE(StampDiscoveries(b.base(), b.bytes, 900, &s).ok());
  EXPECT_EQ(s.entries[0].time_discovered_completed_ns, 500u);
  EXPECT_EQ(s.entries[1].time_discovered_started_ns, 500u);
  EXPECT_EQ(s.entries[1].time_discovered_completed_ns, 900u);

  // Record 4 reuses slot 0: record 0's stamps must not show on it.
  w->Begin({.op = CollectiveOp::kAllReduce, .inputs = {&t, 1}, .outputs = {&t, 1}});
  w->Started(w->Begin({.op = CollectiveOp::kAllReduce, .inputs = {&t, 1}, .outputs = {&t, 1}}));
  s = MustRead(b);
  ASSERT_EQ(s.entries.back().record_id, 4u);
  EXPECT_FALSE(s.entries.back().time_discovered_started_ns.has_value());
}

// ---- Corrupted headers: DATA_LOSS naming the field, never a crash. ----

struct HeaderCase {
  const char* name;
  std::function<void(ControlBlockHeader*)> corrupt;
  const char* field;
};

class CorruptHeader : public ::testing::TestWithParam<HeaderCase> {};

TEST_P(CorruptHeader, IsDataLoss) {
  TestBlock b(8);
  RecordMix(*b.Writer(), 5);
  GetParam().corrupt(reinterpret_cast<ControlBlockHeader*>(b.base()));
  auto s = ReadControlBlock(b.base(), b.bytes);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find(GetParam().field), std::string::npos) << s.status();
}

INSTANTIATE_TEST_SUITE_P(
    AllFields, CorruptHeader,
    ::testing::Values(
        HeaderCase{"magic", [](ControlBlockHeader* h) { h->magic ^= 1; }, "magic"},
        HeaderCase{"version", [](ControlBlockHeader* h) { h->abi_version = 2; }, "abi_version"},
        HeaderCase{"header_bytes", [](ControlBlockHeader* h) { h->header_bytes = 64; },
                   "header_bytes"},
        HeaderCase{"capacity_not_pow2", [](ControlBlockHeader* h) { h->ring_capacity = 6; },
                   "ring_capacity"},
        HeaderCase{"capacity_huge", [](ControlBlockHeader* h) { h->ring_capacity = 1u << 31; },
                   "ring_capacity"},
        HeaderCase{"capacity_beyond_mapping",
                   [](ControlBlockHeader* h) {
                     h->ring_capacity = 16;
                     h->total_bytes = ControlBlockBytes(16);
                     h->discovery_offset = DiscoveryOffset(16);
                   },
                   "does not fit"},
        HeaderCase{"entry_bytes", [](ControlBlockHeader* h) { h->entry_bytes = 8; }, "entry_bytes"},
        HeaderCase{"total_bytes", [](ControlBlockHeader* h) { h->total_bytes = ~0ull; },
                   "total_bytes"},
        HeaderCase{"ring_offset", [](ControlBlockHeader* h) { h->ring_offset = 1u << 30; },
                   "ring_offset"},
        HeaderCase{"discovery_offset", [](ControlBlockHeader* h) { h->discovery_offset = 0; },
                   "discovery_offset"},
        HeaderCase{"rank", [](ControlBlockHeader* h) { h->rank = 2; }, "rank"},
        HeaderCase{"world_size", [](ControlBlockHeader* h) { h->world_size = 0; }, "rank"}),
    [](const ::testing::TestParamInfo<HeaderCase>& info) { return info.param.name; });

TEST(RingReader, RejectsBadMappings) {
  TestBlock b(8);
  EXPECT_EQ(ReadControlBlock(nullptr, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadControlBlock(b.base() + 4, b.bytes - 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadControlBlock(b.base(), 100).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadControlBlock(b.base(), b.bytes - 1).status().code(), absl::StatusCode::kDataLoss);
  auto s = ReadControlBlock(b.base(), b.bytes, {.expected_capacity = 16});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
}

// ---- Corrupted entries: skipped and counted by reason; the others still decode. ----

struct EntryCase {
  const char* name;
  uint32_t slot;  // RecordMix: 0 all-reduce, 1 all-gather, 2 send, 3 recv, 4 reduce-scatter
  std::function<void(RingEntry*)> corrupt;
  InvalidReason reason;
};

class CorruptEntry : public ::testing::TestWithParam<EntryCase> {};

TEST_P(CorruptEntry, IsSkippedAndCounted) {
  TestBlock b(8);
  RecordMix(*b.Writer(), 6);
  GetParam().corrupt(b.entry(GetParam().slot));
  RingSnapshot s = MustRead(b, {.max_tries = 4});
  EXPECT_EQ(s.invalid_entries, 1u);
  EXPECT_EQ(s.invalid_by_reason[size_t(GetParam().reason)], 1u)
      << InvalidReasonName(GetParam().reason);
  EXPECT_EQ(s.entries.size(), 5u);
  for (const RecordedEntry& e : s.entries) EXPECT_NE(e.record_id, GetParam().slot);
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, CorruptEntry,
    ::testing::Values(
        EntryCase{"seq_odd", 0, [](RingEntry* e) { e->seq |= 1; }, InvalidReason::kUnsettled},
        EntryCase{"record_id_other_slot", 1, [](RingEntry* e) { e->record_id = 2; },
                  InvalidReason::kRecordId},
        EntryCase{"record_id_future", 1, [](RingEntry* e) { e->record_id = 1 + (8ull << 40); },
                  InvalidReason::kRecordId},
        EntryCase{"state", 0, [](RingEntry* e) { e->state = 7; }, InvalidReason::kState},
        EntryCase{"op", 0, [](RingEntry* e) { e->op = 999; }, InvalidReason::kOp},
        EntryCase{"flags_unknown", 0, [](RingEntry* e) { e->flags |= 0x80; },
                  InvalidReason::kFlags},
        EntryCase{"p2p_flag_on_collective", 0, [](RingEntry* e) { e->flags |= kRecordFlagP2p; },
                  InvalidReason::kFlags},
        EntryCase{"send_without_p2p_flag", 2, [](RingEntry* e) { e->flags = 0; },
                  InvalidReason::kFlags},
        EntryCase{"too_many_tensors", 0, [](RingEntry* e) { e->num_inputs = 9; },
                  InvalidReason::kTensorCount},
        EntryCase{"total_below_recorded", 0, [](RingEntry* e) { e->total_outputs = 0; },
                  InvalidReason::kTensorCount},
        EntryCase{"too_many_dims", 0, [](RingEntry* e) { e->input_ndims[0] = 5; },
                  InvalidReason::kDims},
        EntryCase{"negative_dim", 1, [](RingEntry* e) { e->output_dims[0][0] = -3; },
                  InvalidReason::kDims},
        EntryCase{"dtype", 0, [](RingEntry* e) { e->output_dtypes[0] = 200; },
                  InvalidReason::kDtype},
        EntryCase{"name_unterminated", 0,
                  [](RingEntry* e) { std::memset(e->pg_name, 'x', sizeof(e->pg_name)); },
                  InvalidReason::kName},
        EntryCase{"desc_unterminated", 3,
                  [](RingEntry* e) { std::memset(e->pg_desc, 0xff, sizeof(e->pg_desc)); },
                  InvalidReason::kName},
        EntryCase{"peer_outside_group", 2, [](RingEntry* e) { e->peer = 2; }, InvalidReason::kPeer},
        EntryCase{"peer_negative", 3, [](RingEntry* e) { e->peer = -7; }, InvalidReason::kPeer}),
    [](const ::testing::TestParamInfo<EntryCase>& info) { return info.param.name; });

TEST(RingReader, SanitizesInvalidUtf8InNames) {
  TestBlock b(4);
  RecordMix(*b.Writer(), 1);
  std::memcpy(b.entry(0)->pg_name, "a\xff\xc3(\xe2\x82\xac", 8);  // bad, bad pair, then "€"
  RingSnapshot s = MustRead(b);
  ASSERT_EQ(s.entries.size(), 1u);
  EXPECT_EQ(s.entries[0].pg_name,
            "a?"
            "?(\xe2\x82\xac");
}

TEST(RingReader, WorkIsBoundedWhenNothingSettles) {
  TestBlock b(4096);
  for (uint32_t i = 0; i < 4096; ++i) b.entry(i)->seq = 1;
  const auto start = std::chrono::steady_clock::now();
  RingSnapshot s = MustRead(b);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.invalid_by_reason[size_t(InvalidReason::kUnsettled)], 4096u);
  EXPECT_TRUE(s.entries.empty());
  EXPECT_LT(took, std::chrono::seconds(1));
}

TEST(RingReader, RandomBytesUnderAValidHeaderNeverCrash) {
  std::mt19937_64 rng(7);
  TestBlock b(16);
  for (int round = 0; round < 300; ++round) {
    char* ring = b.base() + kRingOffset;
    const size_t n = b.bytes - kRingOffset;
    for (size_t i = 0; i < n; ++i) ring[i] = static_cast<char>(rng() & (round % 2 ? 0x07 : 0xff));
    RingSnapshot s = MustRead(b, {.max_tries = 2});
    EXPECT_LE(s.entries.size() + s.invalid_entries, 16u);
    for (size_t i = 1; i < s.entries.size(); ++i) {
      EXPECT_LT(s.entries[i - 1].record_id, s.entries[i].record_id);
    }
  }
}

// ---- A writer process and a reader process on one memfd mapping. ----

// What the child writes for record i, so that the reader can tell a torn entry.
void WriteRecord(RingWriter& w, uint64_t i) {
  const int64_t in[2] = {int64_t(i), int64_t(i % 7 + 1)};
  const int64_t out[1] = {int64_t(i) * 2};
  const TensorDesc ti{.dims = in, .ndim = 2, .dtype = DataType(i % kDataTypeCount)};
  const TensorDesc to{.dims = out, .ndim = 1, .dtype = DataType::kInt64};
  RecordHandle h = w.Begin({.op = CollectiveOp::kAllReduce,
                            .inputs = {&ti, 1},
                            .outputs = {&to, 1},
                            .timeout_ms = i ^ 0x5a5a});
  w.Started(h);
  if (i % 3 != 0) w.Completed(h);
}

// Empty when consistent, else what is wrong.
std::string CheckRecord(const RecordedEntry& e) {
  const uint64_t i = e.record_id;
  // Fake clock: 1000 ns per call; before record i come 3i - ceil(i/3) calls (records j with
  // j % 3 == 0 never complete).
  const uint64_t created = 1'000'000 + (3 * i - (i + 2) / 3 + 1) * 1000;
  if (e.input_sizes != std::vector<std::vector<int64_t>>{{int64_t(i), int64_t(i % 7 + 1)}} ||
      e.output_sizes != std::vector<std::vector<int64_t>>{{int64_t(i) * 2}} ||
      e.input_dtypes[0] != DataType(i % kDataTypeCount) || e.timeout_ms != (i ^ 0x5a5a) ||
      e.collective_seq_id != i + 1 || e.op_id != i + 1 || e.pg_desc != "default_pg") {
    return "fields of record " + std::to_string(i);
  }
  if (e.time_created_ns != created) return "time_created of record " + std::to_string(i);
  if (e.state != RecordState::kScheduled && e.time_started_ns != created + 1000) {
    return "time_started of record " + std::to_string(i);
  }
  if (e.state == RecordState::kCompleted && i % 3 == 0) return "completed " + std::to_string(i);
  return "";
}

TEST(RingReaderConcurrency, ForkedWriterNeverShowsATornEntry) {
  constexpr uint32_t kCapacity = 64;
  constexpr uint64_t kRecords = 100'000;
  const size_t bytes = ControlBlockBytes(kCapacity);
  UniqueFd fd(memfd_create("commd-ring-test", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), bytes), 0);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(base, MAP_FAILED);
  ASSERT_TRUE(InitControlBlock(base, bytes, {.ring_capacity = kCapacity}).ok());

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto w = RingWriter::Attach(
        base, bytes, {.pg_desc = "default_pg", .clock = std::make_unique<testing::FakeClock>()});
    if (!w.ok()) _exit(2);
    for (uint64_t i = 0; i < kRecords; ++i) WriteRecord(**w, i);
    _exit(0);
  }
  // A read while the writer laps the 64-slot ring must still keep the newest entries: read
  // oldest first, the writer would overtake the scan and leave it empty.
  uint64_t snapshots = 0, entries_seen = 0, unsettled = 0, empty_after_writes = 0;
  int status = 0;
  bool done = false;
  while (!done) {
    done = waitpid(child, &status, WNOHANG) == child;  // one last read after the exit
    auto s = ReadControlBlock(base, bytes, {.expected_capacity = kCapacity});
    ASSERT_TRUE(s.ok()) << s.status();
    ++snapshots;
    unsettled += s->invalid_by_reason[size_t(InvalidReason::kUnsettled)];
    ASSERT_EQ(s->invalid_entries, s->invalid_by_reason[size_t(InvalidReason::kUnsettled)]);
    for (size_t k = 0; k < s->entries.size(); ++k) {
      ASSERT_EQ(CheckRecord(s->entries[k]), "");
      if (k > 0) {
        ASSERT_LT(s->entries[k - 1].record_id, s->entries[k].record_id);
      }
    }
    entries_seen += s->entries.size();
    if (s->next_record_id > 0 && s->entries.empty()) ++empty_after_writes;
    if (done) {
      EXPECT_EQ(s->next_record_id, kRecords);
      EXPECT_EQ(s->dropped, kRecords - kCapacity);
      ASSERT_EQ(s->entries.size(), kCapacity);
      EXPECT_EQ(s->entries.back().record_id, kRecords - 1);
    }
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_GT(snapshots, 1u);
  EXPECT_EQ(empty_after_writes, 0u) << "of " << snapshots << " snapshots";
  RecordProperty("snapshots", std::to_string(snapshots));
  RecordProperty("unsettled", std::to_string(unsettled));
  std::printf("snapshots=%lu entries=%lu unsettled=%lu empty=%lu\n", (unsigned long)snapshots,
              (unsigned long)entries_seen, (unsigned long)unsettled,
              (unsigned long)empty_after_writes);
  munmap(base, bytes);
}

}  // namespace
}  // namespace commd
