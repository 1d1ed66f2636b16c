#include "common/control_block.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/control_block_admin.h"
#include "common/control_block_clock.h"
#include "common/control_block_writer.h"

namespace commd {
namespace {

class FakeClock : public RecorderClock {
 public:
  explicit FakeClock(uint64_t* now) : now_(now) {}
  uint64_t NowNs() override { return (*now_)++; }

 private:
  uint64_t* now_;
};

struct Block {
  explicit Block(uint32_t capacity) : bytes(ControlBlockBytes(capacity)) {
    mem.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    EXPECT_TRUE(InitControlBlock(mem.get(), bytes,
                                 {.ring_capacity = capacity,
                                  .rank = 1,
                                  .world_size = 4,
                                  .global_rank = 9,
                                  .created_ns = 123})
                    .ok());
  }
  template <typename T>
  T* at(uint64_t offset) {
    return reinterpret_cast<T*>(mem.get() + offset);
  }
  RingEntry* entry(uint32_t slot) { return at<RingEntry>(kRingOffset) + slot; }
  size_t bytes;
  std::unique_ptr<char, decltype(&std::free)> mem{nullptr, &std::free};
};

std::unique_ptr<RingWriter> Attach(Block& b, uint64_t* now) {
  auto w = RingWriter::Attach(b.mem.get(), b.bytes,
                              {.pg_id = 7,
                               .pg_name = "group0",
                               .pg_desc = "default_pg",
                               .clock = std::make_unique<FakeClock>(now)});
  EXPECT_TRUE(w.ok()) << w.status();
  return std::move(w).value();
}

TEST(ControlBlockAbi, SectionsAreFixedAndAligned) {
  EXPECT_EQ(kProgressOffset, 128u);
  EXPECT_EQ(kRingStateOffset, 192u);
  EXPECT_EQ(kCountersOffset, 256u);
  EXPECT_EQ(kAbortOffset, 448u);
  EXPECT_EQ(kRingOffset, 768u);
  EXPECT_EQ(sizeof(RingEntry), 832u);
  EXPECT_EQ(alignof(RingEntry), 64u);
  EXPECT_EQ(DiscoveryOffset(16), 768u + 16 * 832);
  EXPECT_EQ(ControlBlockBytes(16), 768u + 16 * 864);
  EXPECT_EQ(ControlBlockBytes(kRingMaxCapacity), 768u + uint64_t{kRingMaxCapacity} * 864);
  for (uint32_t bad : {0u, 3u, 12u, kRingMaxCapacity * 2}) EXPECT_EQ(ControlBlockBytes(bad), 0u);
  EXPECT_EQ(offsetof(ControlBlockAbort, reason) % 4, 0u);  // futex word
}

TEST(ControlBlockAbi, NameTablesCoverEveryValue) {
  for (uint32_t i = 0; i < kRecordOpCount; ++i) EXPECT_NE(RecordOpTorchName(i), nullptr) << i;
  EXPECT_EQ(RecordOpTorchName(kRecordOpCount), nullptr);
  for (uint32_t i = 0; i < kDataTypeCount; ++i) EXPECT_GT(DataTypeSize(DataType(i)), 0u) << i;
  EXPECT_STREQ(RecordOpTorchName(uint32_t(CollectiveOp::kAllReduce)), "all_reduce");
  EXPECT_STREQ(DataTypeInfo(DataType::kBFloat16).scalar, "BFloat16");
  EXPECT_STREQ(AbortReasonName(uint32_t(AbortReason::kStuck)), "stuck");
  for (uint32_t r = 0; r < kAbortReasonCount; ++r) {
    EXPECT_EQ(AbortReasonFromName(AbortReasonName(r)), r);
    EXPECT_EQ(std::string_view(AbortReasonWords(r)).find("reason "), std::string_view::npos) << r;
  }
  EXPECT_EQ(AbortReasonFromName("no such reason"), kAbortReasonCount);
  EXPECT_STREQ(AbortReasonWords(uint32_t(AbortReason::kPeerDead)),
               "because a rank of the group died");
  EXPECT_STREQ(AbortReasonWords(kAbortReasonCount), "for a reason this build does not know");
}

TEST(ControlBlockInit, WritesHeader) {
  Block b(8);
  const auto* h = b.at<ControlBlockHeader>(0);
  EXPECT_EQ(h->magic, kControlBlockMagic);
  EXPECT_EQ(h->abi_version, kControlBlockAbiVersion);
  EXPECT_EQ(h->total_bytes, ControlBlockBytes(8));
  EXPECT_EQ(h->ring_capacity, 8u);
  EXPECT_EQ(h->entry_bytes, sizeof(RingEntry));
  EXPECT_EQ(h->rank, 1);
  EXPECT_EQ(h->world_size, 4);
  EXPECT_EQ(h->global_rank, 9);
  EXPECT_EQ(h->ring_offset, kRingOffset);
  EXPECT_EQ(h->discovery_offset, DiscoveryOffset(8));
  EXPECT_EQ(h->created_ns, 123u);
}

TEST(ControlBlockInit, RejectsBadParameters) {
  Block b(8);
  auto status = InitControlBlock(b.mem.get(), b.bytes, {.ring_capacity = 6});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("ring capacity 6"), std::string::npos) << status;
  status = InitControlBlock(b.mem.get(), b.bytes - 1, {.ring_capacity = 8});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = InitControlBlock(b.mem.get(), b.bytes, {.ring_capacity = 8, .rank = 4, .world_size = 4});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = InitControlBlock(b.mem.get() + 8, b.bytes - 64, {.ring_capacity = 4});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(RingWriter, AttachRejectsForeignMemory) {
  Block b(8);
  b.at<ControlBlockHeader>(0)->abi_version = 99;
  auto w = RingWriter::Attach(b.mem.get(), b.bytes);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  Block c(8);
  w = RingWriter::Attach(c.mem.get(), c.bytes - 32);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RingWriter, BeginStartedCompletedWriteEntryProgressAndCounters) {
  Block b(8);
  uint64_t now = 1000;
  auto w = Attach(b, &now);
  const int64_t dims[] = {2, 3};
  TensorDesc t{.dims = dims, .ndim = 2, .dtype = DataType::kBFloat16};
  RecordHandle h = w->Begin(
      {.op = CollectiveOp::kAllReduce, .inputs = {&t, 1}, .outputs = {&t, 1}, .timeout_ms = 5000});
  const RingEntry* e = b.entry(0);
  EXPECT_EQ(e->seq, 2u);
  EXPECT_EQ(e->record_id, 0u);
  EXPECT_EQ(e->pg_id, 7u);
  EXPECT_STREQ(e->pg_name, "group0");
  EXPECT_STREQ(e->pg_desc, "default_pg");
  EXPECT_EQ(e->collective_seq_id, 1u);
  EXPECT_EQ(e->p2p_seq_id, 0u);
  EXPECT_EQ(e->op_id, 1u);
  EXPECT_EQ(e->time_created_ns, 1000u);
  EXPECT_EQ(e->state, uint8_t(RecordState::kScheduled));
  EXPECT_EQ(e->bytes, 2u * 3 * 2);
  EXPECT_EQ(e->num_inputs, 1);
  EXPECT_EQ(e->input_ndims[0], 2);
  EXPECT_EQ(e->input_dims[0][1], 3);
  EXPECT_EQ(e->output_dtypes[0], uint8_t(DataType::kBFloat16));
  EXPECT_EQ(e->timeout_ms, 5000u);
  EXPECT_EQ(e->peer, -1);
  const auto* p = b.at<ControlBlockProgress>(kProgressOffset);
  EXPECT_EQ(p->last_enqueued_seq, 1u);
  EXPECT_EQ(p->last_started_seq, 0u);

  w->Started(h);
  EXPECT_EQ(e->seq, 4u);
  EXPECT_EQ(e->state, uint8_t(RecordState::kStarted));
  EXPECT_EQ(e->time_started_ns, 1001u);
  EXPECT_EQ(p->last_started_seq, 1u);
  w->NanChecked(h, true);
  w->Completed(h);
  EXPECT_EQ(e->state, uint8_t(RecordState::kCompleted));
  EXPECT_EQ(e->time_completed_ns, 1002u);
  EXPECT_EQ(e->flags, kRecordFlagRetired | kRecordFlagNan);
  EXPECT_EQ(p->last_completed_seq, 1u);
  EXPECT_EQ(p->heartbeat_ns, 1002u);
  const auto* c = b.at<ControlBlockCounters>(kCountersOffset);
  EXPECT_EQ(c->collectives, 1u);
  EXPECT_EQ(c->bytes, 12u);
  EXPECT_EQ(c->nan_checks, 1u);
  EXPECT_EQ(c->nans_found, 1u);
  EXPECT_EQ(c->per_op[uint32_t(CollectiveOp::kAllReduce)], 1u);
}

TEST(RingWriter, BeginStartedIsBeginThenStartedWithOneClockRead) {
  Block b(8);
  uint64_t now = 500;
  auto w = Attach(b, &now);
  RecordHandle h = w->BeginStarted({.op = CollectiveOp::kBarrier});
  const RingEntry* e = b.entry(0);
  EXPECT_EQ(e->seq, 2u);  // one seqlock section
  EXPECT_EQ(e->state, uint8_t(RecordState::kStarted));
  EXPECT_EQ(e->time_created_ns, 500u);
  EXPECT_EQ(e->time_started_ns, 500u);
  EXPECT_EQ(now, 501u);
  const auto* p = b.at<ControlBlockProgress>(kProgressOffset);
  EXPECT_EQ(p->last_enqueued_seq, 1u);
  EXPECT_EQ(p->last_started_seq, 1u);
  w->Completed(h);
  EXPECT_EQ(e->time_completed_ns, 501u);
  EXPECT_EQ(p->last_completed_seq, 1u);
}

TEST(RingWriter, SequenceIdsFollowPyTorch) {
  Block b(16);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  w->Begin({.op = CollectiveOp::kAllReduce});
  w->Begin({.op = CollectiveOp::kSend, .peer = 2});
  w->Begin({.op = CollectiveOp::kRecv, .peer = 3});
  w->Begin({.op = CollectiveOp::kAllGather});
  w->Begin({.op = CollectiveOp::kCoalesced, .same_seq_as_previous = true});
  struct Want {
    uint64_t coll, p2p, op_id;
    int32_t peer;
  } want[] = {{1, 0, 1, -1}, {1, 1, 2, 2}, {1, 2, 3, 3}, {2, 2, 4, -1}, {2, 2, 5, -1}};
  for (uint32_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(b.entry(i)->collective_seq_id, want[i].coll);
    EXPECT_EQ(b.entry(i)->p2p_seq_id, want[i].p2p);
    EXPECT_EQ(b.entry(i)->op_id, want[i].op_id);
    EXPECT_EQ(b.entry(i)->peer, want[i].peer);
  }
  EXPECT_EQ(b.entry(1)->flags & kRecordFlagP2p, kRecordFlagP2p);
  EXPECT_EQ(b.at<ControlBlockProgress>(kProgressOffset)->last_enqueued_seq, 2u);
}

TEST(RingWriter, TruncatesTensorsDimsAndNames) {
  Block b(4);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  // 62 ASCII bytes then a 3-byte character: the cut must not split it.
  std::string name(62, 'n');
  name += "\xe2\x82\xac";
  auto pg = w->RegisterProcessGroup(3, name, "tp");
  ASSERT_TRUE(pg.ok());
  const int64_t six[] = {2, 3, 4, 5, 6, 7};
  std::vector<TensorDesc> ts(10, TensorDesc{.dims = six, .ndim = 6});
  w->Begin({.op = CollectiveOp::kAllGather, .pg = *pg, .inputs = ts, .outputs = {ts.data(), 1}});
  const RingEntry* e = b.entry(0);
  EXPECT_EQ(std::string(e->pg_name), std::string(62, 'n'));
  EXPECT_EQ(e->pg_id, 3u);
  EXPECT_EQ(e->num_inputs, kRecordMaxTensors);
  EXPECT_EQ(e->total_inputs, 10u);
  EXPECT_EQ(e->num_outputs, 1);
  EXPECT_EQ(e->input_ndims[7], kRecordMaxDims);
  EXPECT_EQ(e->input_dims[7][3], 5 * 6 * 7);  // folded: numel is kept
  EXPECT_EQ(e->flags & kRecordFlagTruncated, kRecordFlagTruncated);
  EXPECT_EQ(e->bytes, 10u * 5040 * 4);  // every input counts, recorded or not
}

TEST(RingWriter, WrapsAndCountsDropped) {
  Block b(4);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  RecordHandle first = w->Begin({});
  for (int i = 1; i < 11; ++i) {
    RecordHandle h = w->Begin({});
    if (i < 8) w->Completed(h);
  }
  const auto* rs = b.at<ControlBlockRingState>(kRingStateOffset);
  EXPECT_EQ(rs->next_record_id, 11u);
  EXPECT_EQ(rs->dropped, 7u);
  for (uint32_t slot = 0; slot < 4; ++slot) EXPECT_EQ(b.entry(slot)->record_id % 4, slot);
  EXPECT_EQ(b.entry(0)->record_id, 8u);
  // A stale handle leaves the newer entry in its slot alone but still counts.
  w->Completed(first);
  EXPECT_EQ(b.entry(0)->state, uint8_t(RecordState::kScheduled));
  EXPECT_EQ(b.at<ControlBlockCounters>(kCountersOffset)->collectives, 8u);
  // A writer re-attaching continues the record ids.
  auto w2 = Attach(b, &now);
  EXPECT_EQ(w2->Begin({}).record_id, 11u);
}

// What a part of a collective may name (CollectiveOptions::part_of): a begun entry of this
// writer, not retired, still in the ring, whose seq and op are the handle's.
TEST(RingWriter, PendingIsABegunUnretiredEntryStillInTheRing) {
  Block b(4);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  const RecordHandle scheduled = w->Begin({.op = CollectiveOp::kAllGather});
  const RecordHandle started = w->BeginStarted({});
  EXPECT_TRUE(w->Pending(scheduled));
  EXPECT_TRUE(w->Pending(started));
  RecordHandle other_seq = started;
  ++other_seq.collective_seq_id;
  EXPECT_FALSE(w->Pending(other_seq));
  RecordHandle other_op = scheduled;
  other_op.op = CollectiveOp::kAllReduce;
  EXPECT_FALSE(w->Pending(other_op));
  EXPECT_FALSE(w->Pending(RecordHandle{}));                            // never begun
  EXPECT_FALSE(w->Pending({.record_id = 2, .collective_seq_id = 3}));  // not yet begun
  w->Completed(scheduled);
  w->Abandon(started);
  EXPECT_FALSE(w->Pending(scheduled));
  EXPECT_FALSE(w->Pending(started));
  const RecordHandle wrapped = w->Begin({});
  for (int i = 0; i < 4; ++i) w->Begin({});
  EXPECT_FALSE(w->Pending(wrapped));  // its slot holds a newer entry
}

// A slot keeps the group names it holds from this writer's previous lap only when the new
// entry is of the same group: entries of two groups mixed over five laps of a 4-slot ring
// each carry their own group's id, name and description.
TEST(RingWriter, EverySlotHoldsItsEntrysGroupOverLaps) {
  Block b(4);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  auto tp = w->RegisterProcessGroup(3, "tp", "tensor parallel");
  ASSERT_TRUE(tp.ok());
  struct Want {
    uint64_t id;
    const char* name;
    const char* desc;
  };
  const Want groups[] = {{7, "group0", "default_pg"}, {3, "tp", "tensor parallel"}};
  const uint32_t pgs[] = {0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0};
  for (uint32_t i = 0; i < std::size(pgs); ++i) {
    SCOPED_TRACE(i);
    const uint32_t pg = pgs[i] == 0 ? 0 : *tp;
    const RecordHandle h = w->BeginStarted({.op = CollectiveOp::kAllReduce, .pg = pg});
    w->Completed(h);
    const RingEntry* e = b.entry(i % 4);
    EXPECT_EQ(e->record_id, i);
    EXPECT_EQ(e->pg_id, groups[pgs[i]].id);
    EXPECT_STREQ(e->pg_name, groups[pgs[i]].name);
    EXPECT_STREQ(e->pg_desc, groups[pgs[i]].desc);
  }
}

// Each entry records its own tensors whatever the slot held before and whatever the previous
// call's shape: 1-D (the short path), none, 2-D, ten 6-D tensors (truncated), over 3 laps.
TEST(RingWriter, EachEntryRecordsItsOwnShape) {
  Block b(4);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  const int64_t five[] = {5}, zero[] = {0}, negative[] = {-3}, two_by_three[] = {2, 3};
  const int64_t six[] = {2, 3, 4, 5, 6, 7};
  const TensorDesc one_d{.dims = five, .ndim = 1, .dtype = DataType::kFloat32};
  const TensorDesc empty_d{.dims = zero, .ndim = 1, .dtype = DataType::kInt64};
  const TensorDesc negative_d{.dims = negative, .ndim = 1, .dtype = DataType::kInt32};
  const TensorDesc two_d{.dims = two_by_three, .ndim = 2, .dtype = DataType::kBFloat16};
  const std::vector<TensorDesc> ten(10, TensorDesc{.dims = six, .ndim = 6});
  struct Case {
    std::span<const TensorDesc> in;
    uint64_t bytes;
    std::vector<uint8_t> ndims;  // of the recorded inputs; the rest must read 0
    std::vector<uint8_t> dtypes;
    int64_t first_dim;
    uint8_t truncated;
  };
  const std::vector<Case> cases = {
      {{&one_d, 1}, 20, {1}, {0}, 5, 0},
      {{}, 0, {}, {}, 0, 0},
      {{&two_d, 1}, 12, {2}, {2}, 2, 0},
      {ten, 10u * 5040 * 4, std::vector<uint8_t>(8, kRecordMaxDims), std::vector<uint8_t>(8, 0), 2,
       kRecordFlagTruncated},
      {{&one_d, 1}, 20, {1}, {0}, 5, 0},
      {{&empty_d, 1}, 0, {1}, {4}, 0, 0},
      {{&negative_d, 1}, 0, {1}, {3}, -3, 0},
  };
  for (uint32_t i = 0; i < 12; ++i) {
    SCOPED_TRACE(i);
    const Case& c = cases[i % cases.size()];
    const RecordHandle h =
        w->BeginStarted({.op = CollectiveOp::kAllGather, .inputs = c.in, .outputs = c.in});
    EXPECT_EQ(h.bytes, c.bytes);
    const RingEntry* e = b.entry(i % 4);
    EXPECT_EQ(e->bytes, c.bytes);
    EXPECT_EQ(e->num_inputs, c.ndims.size());
    EXPECT_EQ(e->num_outputs, c.ndims.size());
    EXPECT_EQ(e->total_inputs, c.in.size());
    EXPECT_EQ(e->flags & kRecordFlagTruncated, c.truncated);
    for (uint32_t t = 0; t < kRecordMaxTensors; ++t) {
      SCOPED_TRACE(t);
      EXPECT_EQ(e->input_ndims[t], t < c.ndims.size() ? c.ndims[t] : 0);
      EXPECT_EQ(e->output_ndims[t], t < c.ndims.size() ? c.ndims[t] : 0);
      EXPECT_EQ(e->input_dtypes[t], t < c.dtypes.size() ? c.dtypes[t] : 0);
    }
    if (!c.ndims.empty()) {
      EXPECT_EQ(e->input_dims[0][0], c.first_dim);
      EXPECT_EQ(e->output_dims[0][0], c.first_dim);
    }
    if (c.ndims.size() == 1 && c.ndims[0] == 2) EXPECT_EQ(e->input_dims[0][1], 3);
  }
}

// A prepared shape (RingWriter::Prepare) records exactly what its arguments record in full,
// whatever its slot held before: two blocks, one written from the arguments on every call
// and one from prepared shapes, stay byte-identical (entries, progress words, counters) over
// five laps of a small ring, with every kind of shape (none, 1-D, 2-D, truncated, p2p, a
// second group), a shape repeated in every slot (where the slots keep its fields) and shapes
// that move from slot to slot, unprepared calls in between, and every transition.
TEST(RingWriter, PreparedShapesWriteWhatTheirArgumentsWrite) {
  constexpr uint32_t kCapacity = 8;
  Block full_block(kCapacity), prepared_block(kCapacity);
  uint64_t full_now = 1, prepared_now = 1;
  auto full = Attach(full_block, &full_now);
  auto prepared = Attach(prepared_block, &prepared_now);
  const auto tp = full->RegisterProcessGroup(3, "tp", "tensor parallel");
  ASSERT_TRUE(tp.ok());
  ASSERT_EQ(*prepared->RegisterProcessGroup(3, "tp", "tensor parallel"), *tp);
  const int64_t five[] = {5}, negative[] = {-3}, two_by_three[] = {2, 3};
  const int64_t six[] = {2, 3, 4, 5, 6, 7};
  const TensorDesc one_d{.dims = five, .ndim = 1, .dtype = DataType::kFloat32};
  const TensorDesc negative_d{.dims = negative, .ndim = 1, .dtype = DataType::kInt32};
  const TensorDesc two_d{.dims = two_by_three, .ndim = 2, .dtype = DataType::kBFloat16};
  const std::vector<TensorDesc> ten(10, TensorDesc{.dims = six, .ndim = 6});
  const std::vector<RecordArgs> args = {
      {.op = CollectiveOp::kAllReduce,
       .inputs = {&one_d, 1},
       .outputs = {&one_d, 1},
       .timeout_ms = 9},
      {.op = CollectiveOp::kBarrier, .timeout_ms = 9},
      {.op = CollectiveOp::kAllGather, .pg = *tp, .inputs = {&two_d, 1}, .outputs = {&one_d, 1}},
      {.op = CollectiveOp::kAllReduceCoalesced, .inputs = ten, .outputs = ten, .timeout_ms = 1},
      {.op = CollectiveOp::kSend, .inputs = {&one_d, 1}, .peer = 2},
      {.op = CollectiveOp::kRecv, .pg = *tp, .outputs = {&negative_d, 1}, .peer = 1},
      {.op = CollectiveOp::kReduceScatter,
       .inputs = {&negative_d, 1},
       .outputs = {&one_d, 1},
       .same_seq_as_previous = true},
  };
  std::vector<RecordShape> shapes;
  for (const RecordArgs& a : args) shapes.push_back(RingWriter::Prepare(a));
  for (size_t i = 1; i < shapes.size(); ++i) EXPECT_GT(shapes[i].id, shapes[i - 1].id);
  // Shape 0 in every slot for a lap and a half, then shapes moving from slot to slot (a
  // period of 3 over 8 slots), then all of them; every 7th call unprepared on both sides.
  std::vector<size_t> order(12, 0);
  for (int i = 0; i < 10; ++i) order.push_back(i % 3);
  for (int lap = 0; lap < 3; ++lap) {
    for (size_t k = 0; k < args.size(); ++k) order.push_back((k * 3 + lap) % args.size());
  }
  for (size_t i = 0; i < order.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "call " << i << ", shape " << order[i]);
    const size_t k = order[i];
    const bool unprepared = i % 7 == 6;
    const bool started = i % 2 == 0;
    RecordHandle a = started ? full->BeginStarted(args[k]) : full->Begin(args[k]);
    RecordHandle b = unprepared
                         ? (started ? prepared->BeginStarted(args[k]) : prepared->Begin(args[k]))
                         : (started ? prepared->BeginStartedPrepared(shapes[k])
                                    : prepared->BeginPrepared(shapes[k]));
    EXPECT_EQ(a.record_id, b.record_id);
    EXPECT_EQ(a.collective_seq_id, b.collective_seq_id);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.op, b.op);
    if (!started) {
      full->Started(a);
      prepared->Started(b);
    }
    if (i % 5 == 1) {
      full->NanChecked(a, true);
      prepared->NanChecked(b, true);
    }
    if (i % 4 == 3) {
      full->Abandon(a);
      prepared->Abandon(b);
    } else if (i % 4 != 2) {  // every 4th stays in flight until the slot is reused
      full->Completed(a);
      prepared->Completed(b);
    }
    ASSERT_EQ(std::memcmp(full_block.mem.get(), prepared_block.mem.get(), full_block.bytes), 0)
        << "the blocks differ after this call; its slot's entry: op "
        << prepared_block.entry(b.record_id % kCapacity)->op;
  }
}

TEST(RingWriter, SeesAbortRequest) {
  Block b(4);
  uint64_t now = 1;
  auto w = Attach(b, &now);
  EXPECT_EQ(w->abort_reason(), AbortReason::kNone);
  EXPECT_TRUE(RequestAbort(b.mem.get(), b.bytes, AbortReason::kStuck, "seq 3 stuck", 55));
  EXPECT_FALSE(RequestAbort(b.mem.get(), b.bytes, AbortReason::kAdmin, "later", 56));
  EXPECT_EQ(w->abort_reason(), AbortReason::kStuck);
  EXPECT_EQ(w->abort_text(), "seq 3 stuck");
}

TEST(RecorderClock, TscTracksRealtime) {
  auto tsc = NewTscRecorderClock();
  auto rt = NewRealtimeRecorderClock();
  uint64_t prev = 0;
  for (int i = 0; i < 1000; ++i) {
    uint64_t a = rt->NowNs(), t = tsc->NowNs(), b = rt->NowNs();
    // The same epoch as CLOCK_REALTIME. The bound is loose on purpose: calibration on a
    // loaded machine is off by milliseconds, and tests assert no timings; a clock on another
    // epoch or rate would be off by far more.
    EXPECT_GE(t + 100'000'000, a);
    EXPECT_LE(t, b + 100'000'000);
    EXPECT_GE(t, prev);
    prev = t;
  }
}

}  // namespace
}  // namespace commd
