// Histograms as the daemon's components register them: buckets growing by a constant factor
// (latencies span orders of magnitude), and a histogram of one series under a name of its own.
//
//   prometheus::Histogram& poll = AddHistogram(
//       registry, "commd_watchdog_poll_duration_seconds", "Time one watchdog poll takes",
//       GeometricBuckets(1e-6, 4, 10));  // 1 µs to ~4 s
//
// Thread-safe as prometheus-cpp's registry is.
#ifndef COMMD_DAEMON_METRICS_HISTOGRAMS_H_
#define COMMD_DAEMON_METRICS_HISTOGRAMS_H_

#include <string>

#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace commd::metrics {

// Bucket bounds `first`, `first * factor`, ... for as long as they are below `limit`. Pure.
prometheus::Histogram::BucketBoundaries GeometricBuckets(double first, double factor, double limit);

// The histogram `name` (no labels) of `registry`; it lives as long as the registry.
prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets);

}  // namespace commd::metrics

#endif  // COMMD_DAEMON_METRICS_HISTOGRAMS_H_
