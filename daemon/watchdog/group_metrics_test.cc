// GroupMetrics on real control blocks (memfd-mapped, written by the SDK's RingWriter): the
// series of a {job, group}, what retiring a group removes and keeps, a group formed again
// under the same name, the bound on kept pairs, and two groups sharing a {job, group}.
#include "daemon/watchdog/group_metrics.h"

#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include "common/control_block_admin.h"
#include "common/control_block_writer.h"
#include "gtest/gtest.h"

namespace commd::watchdog {
namespace {

constexpr uint32_t kCapacity = 16;

class Block {
 public:
  Block() {
    const size_t bytes = ControlBlockBytes(kCapacity);
    const int fd = ::memfd_create("group_metrics_test", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    auto m = SharedMapping::Map(fd, bytes);
    ::close(fd);
    EXPECT_TRUE(m.ok()) << m.status();
    mapping_ = std::make_shared<SharedMapping>(std::move(*m));
    EXPECT_TRUE(InitControlBlock(mapping_->data(), bytes, {.ring_capacity = kCapacity}).ok());
    auto w = RingWriter::Attach(mapping_->data(), bytes);
    EXPECT_TRUE(w.ok()) << w.status();
    writer_ = std::move(*w);
  }
  // `n` completed all-reduces of 256 floats, the last `nans` of them with a NaN found.
  void AllReduces(int n, int nans = 0) {
    const int64_t count = 256;
    const TensorDesc t{.dims = &count, .ndim = 1, .dtype = DataType::kFloat32};
    for (int i = 0; i < n; ++i) {
      RecordHandle h = writer_->BeginStarted({.op = CollectiveOp::kAllReduce, .inputs = {&t, 1}});
      writer_->NanChecked(h, i >= n - nans);
      writer_->Completed(h);
    }
  }
  std::shared_ptr<const SharedMapping> mapping() const { return mapping_; }

 private:
  std::shared_ptr<SharedMapping> mapping_;
  std::unique_ptr<RingWriter> writer_;
};

GroupMetrics::Live LiveGroup(const std::string& job, const std::string& group,
                             const std::vector<Block*>& blocks,
                             v1::GroupHealthState state = v1::HEALTHY) {
  GroupMetrics::Live live{.job = job, .group = group, .state = state};
  for (Block* b : blocks) {
    live.blocks.push_back(b->mapping());
    live.progress_ns.push_back(1'700'000'000'000'000'000 + live.progress_ns.size());
  }
  return live;
}

// The value of the series of `name` with exactly `labels`, if it is there.
std::optional<double> Value(const GroupMetrics& metrics, const std::string& name,
                            std::vector<prometheus::ClientMetric::Label> labels) {
  std::sort(labels.begin(), labels.end());
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      auto have = m.label;
      std::sort(have.begin(), have.end());
      if (have != labels) continue;
      switch (f.type) {
        case prometheus::MetricType::Counter:
          return m.counter.value;
        case prometheus::MetricType::Gauge:
          return m.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(m.histogram.sample_count);
        default:
          return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

TEST(GroupMetricsTest, SeriesOfTwoJobsWithOneGroupNameStaySeparate) {
  Block a0, a1, b0, b1;
  a0.AllReduces(3, 1);
  a1.AllReduces(3);
  b0.AllReduces(5);
  b1.AllReduces(5);
  GroupMetrics m;
  m.Update(1, LiveGroup("a", "tp", {&a0, &a1}, v1::ABORTED));
  m.Update(2, LiveGroup("b", "tp", {&b0, &b1}));
  m.CountHang("a", "tp", "lagging");
  m.CountAbort("a", "tp", "lagging");
  m.ObserveDurations("a", "tp", {{static_cast<uint32_t>(CollectiveOp::kAllReduce), 0.002}});

  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "a"}, {"group", "tp"}, {"state", "aborted"}}),
            1);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "a"}, {"group", "tp"}, {"state", "ok"}}), 0);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "b"}, {"group", "tp"}, {"state", "ok"}}), 1);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "b"}, {"group", "tp"}, {"state", "aborted"}}),
            0);
  EXPECT_EQ(
      Value(m, "commd_collectives_total", {{"job", "a"}, {"group", "tp"}, {"op", "all_reduce"}}),
      6);
  EXPECT_EQ(
      Value(m, "commd_collectives_total", {{"job", "b"}, {"group", "tp"}, {"op", "all_reduce"}}),
      10);
  EXPECT_EQ(Value(m, "commd_collective_bytes_total", {{"job", "b"}, {"group", "tp"}}),
            10 * 256 * 4);
  EXPECT_EQ(Value(m, "commd_nan_checks_total", {{"job", "a"}, {"group", "tp"}}), 6);
  EXPECT_EQ(Value(m, "commd_nan_detected_total", {{"job", "a"}, {"group", "tp"}}), 1);
  EXPECT_EQ(Value(m, "commd_nan_detected_total", {{"job", "b"}, {"group", "tp"}}), 0);
  EXPECT_EQ(Value(m, "commd_flight_recorder_entries_total", {{"job", "b"}, {"group", "tp"}}), 10);
  EXPECT_EQ(
      Value(m, "commd_hangs_detected_total", {{"job", "a"}, {"group", "tp"}, {"kind", "lagging"}}),
      1);
  EXPECT_EQ(
      Value(m, "commd_hangs_detected_total", {{"job", "b"}, {"group", "tp"}, {"kind", "lagging"}}),
      std::nullopt);
  EXPECT_EQ(Value(m, "commd_collective_duration_seconds",
                  {{"job", "a"}, {"group", "tp"}, {"op", "all_reduce"}}),
            1);
  EXPECT_TRUE(Value(m, "commd_rank_last_progress_timestamp_seconds",
                    {{"job", "b"}, {"group", "tp"}, {"rank", "1"}})
                  .has_value());

  // Job a's group retires and its ranks record no more (the blocks are final). Its gauges go,
  // job b's stay; its counters keep their final values.
  a0.AllReduces(1);
  m.Retire(1);
  m.Retire(1);  // a second retire of the same group changes nothing
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "a"}, {"group", "tp"}, {"state", "aborted"}}),
            std::nullopt);
  EXPECT_EQ(Value(m, "commd_rank_last_progress_timestamp_seconds",
                  {{"job", "a"}, {"group", "tp"}, {"rank", "0"}}),
            std::nullopt);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "b"}, {"group", "tp"}, {"state", "ok"}}), 1);
  EXPECT_TRUE(Value(m, "commd_rank_last_progress_timestamp_seconds",
                    {{"job", "b"}, {"group", "tp"}, {"rank", "0"}})
                  .has_value());
  EXPECT_EQ(
      Value(m, "commd_collectives_total", {{"job", "a"}, {"group", "tp"}, {"op", "all_reduce"}}),
      7);
  EXPECT_EQ(
      Value(m, "commd_hangs_detected_total", {{"job", "a"}, {"group", "tp"}, {"kind", "lagging"}}),
      1);

  // Job a forms tp again (a restart): its counters count on from the kept values.
  Block a2;
  a2.AllReduces(2);
  m.Update(3, LiveGroup("a", "tp", {&a2}));
  EXPECT_EQ(
      Value(m, "commd_collectives_total", {{"job", "a"}, {"group", "tp"}, {"op", "all_reduce"}}),
      9);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "a"}, {"group", "tp"}, {"state", "ok"}}), 1);
}

TEST(GroupMetricsTest, KeepsTheNewestIdlePairsOnly) {
  GroupMetrics m;
  Block b;
  b.AllReduces(1);
  const size_t n = GroupMetrics::kIdleKept + 3;
  for (size_t i = 0; i < n; ++i) {
    m.Update(i, LiveGroup("j" + std::to_string(i), "g", {&b}));
    m.Retire(i);
  }
  // A rendezvous that timed out counts for a group that never was live.
  m.CountHang("late", "g", "rendezvous");
  for (size_t i = 0; i < n; ++i) {
    const auto v = Value(m, "commd_collectives_total",
                         {{"job", "j" + std::to_string(i)}, {"group", "g"}, {"op", "all_reduce"}});
    if (i < n - GroupMetrics::kIdleKept + 1) {
      EXPECT_EQ(v, std::nullopt) << i;
    } else {
      EXPECT_EQ(v, 1) << i;
    }
  }
  EXPECT_EQ(Value(m, "commd_hangs_detected_total",
                  {{"job", "late"}, {"group", "g"}, {"kind", "rendezvous"}}),
            1);
}

TEST(GroupMetricsTest, GroupsOfTwoUidsWithOneJobAndNameShareTheirSeries) {
  Block x, y;
  x.AllReduces(2);
  y.AllReduces(3);
  GroupMetrics m;
  m.Update(1, LiveGroup("j", "g", {&x}, v1::HEALTHY));
  m.Update(2, LiveGroup("j", "g", {&y}, v1::HUNG));
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "j"}, {"group", "g"}, {"state", "hung"}}), 1);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "j"}, {"group", "g"}, {"state", "ok"}}), 0);
  EXPECT_EQ(
      Value(m, "commd_collectives_total", {{"job", "j"}, {"group", "g"}, {"op", "all_reduce"}}), 5);
  // One of them retires: the pair is still live, the sum goes on (never back).
  m.Retire(2);
  EXPECT_EQ(Value(m, "commd_group_state", {{"job", "j"}, {"group", "g"}, {"state", "ok"}}), 1);
  EXPECT_EQ(
      Value(m, "commd_collectives_total", {{"job", "j"}, {"group", "g"}, {"op", "all_reduce"}}), 5);
}

}  // namespace
}  // namespace commd::watchdog
