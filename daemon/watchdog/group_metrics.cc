#include "daemon/watchdog/group_metrics.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>

#include "daemon/metrics/histograms.h"
#include "daemon/recorder/ring_reader.h"

namespace commd::watchdog {
namespace {

// 10 µs to ~3 min by factors of 4: host collectives of a few KiB at the low end, a rank
// that waited out a long compute phase at the high end.
const std::vector<double>& DurationBounds() {
  static const std::vector<double> bounds = metrics::GeometricBuckets(1e-5, 4, 200);
  return bounds;
}

const char* StateLabel(v1::GroupHealthState s) {
  switch (s) {
    case v1::SUSPECT:
      return "suspect";
    case v1::HUNG:
      return "hung";
    case v1::ABORTED:
      return "aborted";
    default:
      return "ok";
  }
}

// Which of two groups sharing a {job, group} the state gauge shows: the one that needs a look.
int Severity(v1::GroupHealthState s) {
  switch (s) {
    case v1::HUNG:
      return 3;
    case v1::ABORTED:
      return 2;
    case v1::SUSPECT:
      return 1;
    default:
      return 0;
  }
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type) {
  return prometheus::MetricFamily{name, help, type, {}};
}

prometheus::ClientMetric Series(const std::pair<std::string, std::string>& key,
                                std::initializer_list<prometheus::ClientMetric::Label> more = {}) {
  prometheus::ClientMetric m;
  m.label = {{"job", key.first}, {"group", key.second}};
  m.label.insert(m.label.end(), more.begin(), more.end());
  return m;
}

}  // namespace

void GroupMetrics::Update(uint64_t id, Live live) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(id);
  if (it == live_.end()) {
    // A {job, group} that comes back is no longer idle: its kept counters count on.
    const Key key{live.job, live.group};
    idle_.erase(std::remove(idle_.begin(), idle_.end(), key), idle_.end());
    live_.emplace(id, std::move(live));
  } else {
    it->second = std::move(live);
  }
}

void GroupMetrics::SetState(uint64_t id, v1::GroupHealthState state) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(id);
  if (it != live_.end()) it->second.state = state;
}

void GroupMetrics::Retire(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  const Live gone = std::move(it->second);
  live_.erase(it);
  const Key key{gone.job, gone.group};
  AddBlocks(gone, &KeptLocked(key));  // the ranks are gone: these are the final values
  if (!IsLiveLocked(key)) MarkIdleLocked(key);
}

void GroupMetrics::ObserveDurations(const std::string& job, const std::string& group,
                                    absl::Span<const Duration> durations) {
  if (durations.empty()) return;
  const std::vector<double>& bounds = DurationBounds();
  absl::MutexLock lock(&mu_);
  Counts& c = KeptLocked({job, group});
  for (const Duration& d : durations) {
    if (d.op >= kRecordOpCount || !(d.seconds >= 0)) continue;
    Histogram& h = c.durations[d.op];
    if (h.counts.empty()) h.counts.resize(bounds.size() + 1);
    ++h.counts[std::lower_bound(bounds.begin(), bounds.end(), d.seconds) - bounds.begin()];
    h.sum += d.seconds;
    ++h.count;
  }
}

void GroupMetrics::CountHang(const std::string& job, const std::string& group,
                             const std::string& kind) {
  absl::MutexLock lock(&mu_);
  ++KeptLocked({job, group}).hangs[kind];
}

void GroupMetrics::CountAbort(const std::string& job, const std::string& group,
                              const std::string& reason) {
  absl::MutexLock lock(&mu_);
  ++KeptLocked({job, group}).aborts[reason];
}

GroupMetrics::Counts& GroupMetrics::KeptLocked(const Key& key) {
  auto [it, fresh] = kept_.try_emplace(key);
  // Counted for a group that is not (or no longer) live, such as a rendezvous that timed out.
  if (fresh && !IsLiveLocked(key)) MarkIdleLocked(key);
  return it->second;
}

bool GroupMetrics::IsLiveLocked(const Key& key) const {
  for (const auto& [id, g] : live_) {
    if (g.job == key.first && g.group == key.second) return true;
  }
  return false;
}

void GroupMetrics::MarkIdleLocked(const Key& key) {
  if (std::find(idle_.begin(), idle_.end(), key) != idle_.end()) return;
  idle_.push_back(key);
  while (idle_.size() > kIdleKept) {
    kept_.erase(idle_.front());
    idle_.pop_front();
  }
}

void GroupMetrics::AddBlocks(const Live& live, Counts* c) {
  for (const auto& block : live.blocks) {
    if (block == nullptr) continue;
    // Header, progress and counters only; a block whose header a client scribbled on counts
    // nothing (and only in its own job's series).
    auto snap = ReadControlBlock(block->data(), block->size(), {.include_entries = false});
    if (!snap.ok()) continue;
    for (uint32_t op = 0; op < kRecordOpCount; ++op) c->per_op[op] += snap->per_op[op];
    c->bytes += snap->bytes;
    c->nan_checks += snap->nan_checks;
    c->nans_found += snap->nans_found;
    c->entries += snap->next_record_id;
    c->dropped += snap->dropped;
  }
}

std::vector<prometheus::MetricFamily> GroupMetrics::Collect() const {
  std::map<uint64_t, Live> live;
  std::map<Key, Counts> counts;
  {
    absl::MutexLock lock(&mu_);
    live = live_;
    counts = kept_;
  }
  std::map<Key, v1::GroupHealthState> states;
  std::map<std::pair<Key, size_t>, uint64_t> progress;
  for (const auto& [id, g] : live) {
    const Key key{g.job, g.group};
    AddBlocks(g, &counts[key]);
    auto [s, fresh] = states.try_emplace(key, g.state);
    if (!fresh && Severity(g.state) > Severity(s->second)) s->second = g.state;
    for (size_t r = 0; r < g.progress_ns.size(); ++r) {
      if (g.progress_ns[r] == 0) continue;
      auto [p, first] = progress.try_emplace({key, r}, g.progress_ns[r]);
      if (!first) p->second = std::min(p->second, g.progress_ns[r]);
    }
  }
  using prometheus::MetricType;
  auto state = Family("commd_group_state",
                      "1 for the group's current watchdog state (ok, suspect, hung, aborted)",
                      MetricType::Gauge);
  for (const auto& [key, s] : states) {
    for (auto each : {v1::HEALTHY, v1::SUSPECT, v1::HUNG, v1::ABORTED}) {
      state.metric.push_back(Series(key, {{"state", StateLabel(each)}}));
      state.metric.back().gauge.value = each == s ? 1 : 0;
    }
  }
  auto last =
      Family("commd_rank_last_progress_timestamp_seconds",
             "Unix time the daemon last saw the rank complete a collective", MetricType::Gauge);
  for (const auto& [key_rank, ns] : progress) {
    last.metric.push_back(Series(key_rank.first, {{"rank", std::to_string(key_rank.second)}}));
    last.metric.back().gauge.value = static_cast<double>(ns) / 1e9;
  }
  auto collectives =
      Family("commd_collectives_total", "Collectives the ranks of a group completed, by op",
             MetricType::Counter);
  auto bytes =
      Family("commd_collective_bytes_total",
             "Input bytes of the collectives the ranks of a group completed", MetricType::Counter);
  auto nan_checks = Family("commd_nan_checks_total", "NaN/Inf checks the ranks of a group ran",
                           MetricType::Counter);
  auto nans =
      Family("commd_nan_detected_total", "NaN/Inf checks that found one", MetricType::Counter);
  auto entries =
      Family("commd_flight_recorder_entries_total",
             "Flight-recorder entries the ranks of a group recorded", MetricType::Counter);
  auto dropped =
      Family("commd_flight_recorder_dropped_total",
             "Entries overwritten by newer ones before any dump read them", MetricType::Counter);
  auto hangs = Family("commd_hangs_detected_total",
                      "Watchdog findings by kind (stuck, lagging, mismatch, dead, unresponsive, "
                      "rendezvous)",
                      MetricType::Counter);
  auto aborts = Family("commd_aborts_total", "Aborts of a group, by reason", MetricType::Counter);
  auto durations = Family("commd_collective_duration_seconds",
                          "Started to completed, from the ring entries the watchdog saw complete",
                          MetricType::Histogram);
  const std::vector<double>& bounds = DurationBounds();
  for (const auto& [key, c] : counts) {
    for (uint32_t op = 0; op < kRecordOpCount; ++op) {
      if (c.per_op[op] == 0) continue;
      collectives.metric.push_back(Series(key, {{"op", RecordOpTorchName(op)}}));
      collectives.metric.back().counter.value = static_cast<double>(c.per_op[op]);
    }
    for (auto [family, value] : {std::pair{&bytes, c.bytes}, std::pair{&nan_checks, c.nan_checks},
                                 std::pair{&nans, c.nans_found}, std::pair{&entries, c.entries},
                                 std::pair{&dropped, c.dropped}}) {
      family->metric.push_back(Series(key));
      family->metric.back().counter.value = static_cast<double>(value);
    }
    for (const auto& [kind, n] : c.hangs) {
      hangs.metric.push_back(Series(key, {{"kind", kind}}));
      hangs.metric.back().counter.value = static_cast<double>(n);
    }
    for (const auto& [reason, n] : c.aborts) {
      aborts.metric.push_back(Series(key, {{"reason", reason}}));
      aborts.metric.back().counter.value = static_cast<double>(n);
    }
    for (const auto& [op, h] : c.durations) {
      prometheus::ClientMetric m = Series(key, {{"op", RecordOpTorchName(op)}});
      uint64_t cumulative = 0;
      for (size_t b = 0; b < h.counts.size(); ++b) {
        cumulative += h.counts[b];
        m.histogram.bucket.push_back(
            {cumulative, b < bounds.size() ? bounds[b] : std::numeric_limits<double>::infinity()});
      }
      m.histogram.sample_count = h.count;
      m.histogram.sample_sum = h.sum;
      durations.metric.push_back(std::move(m));
    }
  }
  return {state,   last,    collectives, bytes,  nan_checks, nans,
          entries, dropped, hangs,       aborts, durations};
}

}  // namespace commd::watchdog
