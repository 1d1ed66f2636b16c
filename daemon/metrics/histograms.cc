#include "daemon/metrics/histograms.h"

namespace commd::metrics {

prometheus::Histogram::BucketBoundaries GeometricBuckets(double first, double factor,
                                                         double limit) {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = first; v < limit; v *= factor) b.push_back(v);
  return b;
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

}  // namespace commd::metrics
