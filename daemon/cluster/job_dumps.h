// One dump for a job that spans nodes (docs/cluster.md, "One dump for the job"): a dump of one
// job made on any node (commctl dump, a watchdog finding, a rank's death, an abort) is
// announced in etcd under its dump id, and every other node with ranks of that job dumps them
// under the same id, so each node's files of it sit in directories of the same name.
//
//   JobDumps job_dumps(cluster, {}, [&](const RemoteDump& d) { ...dump d.job's groups... });
//   group_dumps.set_publisher(&job_dumps);
//
// The announcement is the key <prefix>/dumps/<uid>/<job>/<dump id> with a small JSON value
// (node, trigger, group, diagnosis), on a lease of its own that expires after key_ttl: keys do
// not pile up, and a node that was cut off for less than that still sees the announcements it
// missed (its watch resumes from the last revision it saw). What an announcement may make a
// node write is bounded by the job's uid's dump rate on that node (limits.per_uid), charged
// by the handler; announcing is bounded by the same rate on the announcing node.
//
// The watch on <prefix>/dumps/ lasts (prefix_watch.h). Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_JOB_DUMPS_H_
#define COMMD_DAEMON_CLUSTER_JOB_DUMPS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/prefix_watch.h"
#include "daemon/recorder/group_dumps.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::cluster {

// A dump another node announced.
struct RemoteDump {
  uid_t uid = 0;
  std::string job_id;
  std::string dump_id;
  std::string node;     // the node that announced it
  std::string trigger;  // what made it: request, hang-stuck, rank_death, abort, ...
  std::string group;    // empty: every group of the job
  std::optional<nlohmann::json> diagnosis;
};

struct JobDumpsOptions {
  absl::Duration key_ttl = absl::Seconds(60);
  size_t max_value_bytes = 16 << 10;  // an announcement's value; a larger diagnosis is cut
};

// The key of an announcement, and back: nullopt for a key that is not one (another prefix, a
// uid that is not a number, a job or dump id outside a job id's alphabet). Pure.
std::string DumpKey(const std::string& prefix, uid_t uid, const std::string& job,
                    const std::string& dump_id);
std::optional<RemoteDump> ParseDumpKey(const std::string& prefix, const std::string& key);

class JobDumps final : public recorder::DumpPublisher {
 public:
  // Runs `on_remote` (on a gRPC thread, one at a time) for each dump another node announces
  // from now on. `cluster` must outlive this object.
  JobDumps(Cluster* cluster, JobDumpsOptions options,
           std::function<void(const RemoteDump&)> on_remote, prometheus::Registry* registry);
  ~JobDumps() override;  // Stop()

  // Ends the watch; later announcements fail UNAVAILABLE. Idempotent.
  void Stop();

  std::string node_name() const override { return cluster_->options().node_name; }
  // A grant of a lease, then the key on it: two etcd calls. UNAVAILABLE naming the endpoint
  // when the cluster is not connected.
  void Publish(recorder::JobDumpNotice notice, std::function<void(absl::Status)> done) override;

 private:
  void OnEvent(const mvccpb::Event& event);
  // The announcement's value: node, trigger, group, and the diagnosis if it fits.
  std::string EncodeValue(const recorder::JobDumpNotice& notice) const;

  Cluster* const cluster_;
  const JobDumpsOptions options_;
  const std::function<void(const RemoteDump&)> on_remote_;
  prometheus::Family<prometheus::Counter>& counters_;
  prometheus::Counter* const published_;
  prometheus::Counter* const publish_failures_;
  prometheus::Counter* const received_;
  prometheus::Gauge* const watching_;
  std::atomic<bool> stopping_{false};
  PrefixWatch watch_;  // last: started after everything it uses
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_JOB_DUMPS_H_
