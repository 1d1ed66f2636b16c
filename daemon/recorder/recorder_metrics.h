// Flight-recorder metrics read from the ranks' control blocks at scrape time (no RPC per
// collective): entries recorded and entries dropped by ring wrap-around, per job and group.
// Series of a group end with the group.
#ifndef COMMD_DAEMON_RECORDER_RECORDER_METRICS_H_
#define COMMD_DAEMON_RECORDER_RECORDER_METRICS_H_

#include <functional>
#include <vector>

#include "daemon/recorder/dumper.h"
#include "prometheus/collectable.h"

namespace commd::recorder {

class RecorderMetrics final : public prometheus::Collectable {
 public:
  // `sources` lists the live control blocks; it is called on the scraping thread.
  explicit RecorderMetrics(std::function<std::vector<DumpSource>()> sources)
      : sources_(std::move(sources)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<std::vector<DumpSource>()> sources_;
};

}  // namespace commd::recorder

#endif  // COMMD_DAEMON_RECORDER_RECORDER_METRICS_H_
