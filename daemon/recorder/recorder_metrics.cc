#include "daemon/recorder/recorder_metrics.h"

#include <map>
#include <utility>

#include "daemon/recorder/ring_reader.h"
#include "prometheus/metric_family.h"

namespace commd::recorder {

std::vector<prometheus::MetricFamily> RecorderMetrics::Collect() const {
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> by_group;
  for (const DumpSource& src : sources_()) {
    // Headers only: counters and progress, not the ring.
    auto snapshot =
        ReadControlBlock(src.block->data(), src.block->size(), {.include_entries = false});
    if (!snapshot.ok()) continue;
    auto& [entries, dropped] = by_group[{src.job_id, src.group}];
    entries += static_cast<double>(snapshot->next_record_id);
    dropped += static_cast<double>(snapshot->dropped);
  }
  prometheus::MetricFamily entries{"commd_flight_recorder_entries_total",
                                   "Flight-recorder entries the ranks of a group recorded",
                                   prometheus::MetricType::Counter,
                                   {}};
  prometheus::MetricFamily dropped{"commd_flight_recorder_dropped_total",
                                   "Entries overwritten by newer ones before any dump read them",
                                   prometheus::MetricType::Counter,
                                   {}};
  for (const auto& [key, values] : by_group) {
    prometheus::ClientMetric m;
    m.label = {{"group", key.second}, {"job", key.first}};
    m.counter.value = values.first;
    entries.metric.push_back(m);
    m.counter.value = values.second;
    dropped.metric.push_back(m);
  }
  return {entries, dropped};
}

}  // namespace commd::recorder
