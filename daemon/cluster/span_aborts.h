// An abort across nodes (docs/cluster.md, "An abort across nodes"): when a formed group that
// spans nodes is aborted on one node, that node announces it in etcd, and every other node
// aborts its ranks of the same formation of the group within a watch event.
//
//   SpanAborts aborts(cluster, {}, &registry);
//   watchdog_options.aborts = &aborts;                 // the watchdog announces
//   aborts.Watch([&](const watchdog::SpanAbortNotice& a) { return dog.OnRemoteAbort(a); });
//   ...
//   aborts.Stop();                                     // before the watchdog goes
//
// The announcement is the key <prefix>/aborts/<uid>/<job>/<group>/<formation> (the group's '/'
// written as %2F, as the rendezvous writes it) holding a v1::SpanAbort (node, reason, text), on
// a lease of its own that expires after key_ttl: keys do not pile up, and a node cut off for
// less than that still sees it when its watch resumes. The watch lists the announcements that
// stand before it first opens (and after etcd compacted what it would resume from), so one
// made before this node watched (a daemon starting, or one cut off at its start) is applied
// too; a listed one of a formation not held here changes nothing. The uid is the one the announcing
// daemon saw on its socket, so a uid's abort reaches only that uid's groups; the formation (the
// etcd revision the group formed at, the same on every node) keeps it from an older or a later
// formation of a group of the same name. Everything read from etcd is parsed untrustingly: a
// key or value that does not parse is skipped, logged and counted (event "rejected").
// An announcement that fails (etcd away) is kept and sent again when the node is connected
// again, until it goes through: at most kMaxPendingSpanAborts wait (each is one
// formation this node aborted, and forming a spanning group needs etcd, so an outage adds
// none beyond the groups formed before it), the newest refused beyond them.
//
// Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_SPAN_ABORTS_H_
#define COMMD_DAEMON_CLUSTER_SPAN_ABORTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/prefix_watch.h"
#include "daemon/watchdog/abort_announcer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::cluster {

// The largest value a reader accepts, and the longest text a writer sends (cut beyond).
inline constexpr size_t kMaxSpanAbortValueBytes = 4096;
inline constexpr size_t kMaxSpanAbortTextBytes = 1024;
// The most announcements kept to send again once etcd answers.
inline constexpr size_t kMaxPendingSpanAborts = 4096;

struct SpanAbortsOptions {
  absl::Duration key_ttl = absl::Seconds(60);
};

// The key of an announcement, and back. ParseSpanAbortKey fills uid, job_id, group and
// formation, or says which part of `key` is wrong (INVALID_ARGUMENT naming the value and what is
// allowed); each part must read back to the same text (no "+1", "01" or stray "%"). Pure.
std::string SpanAbortKey(const std::string& prefix, uid_t uid, const std::string& job,
                         const std::string& group, uint64_t formation);
absl::StatusOr<watchdog::SpanAbortNotice> ParseSpanAbortKey(const std::string& prefix,
                                                            const std::string& key);
// The value for `notice` (node, reason, text cut at kMaxSpanAbortTextBytes), and back into
// `notice`: node, reason and text, or INVALID_ARGUMENT naming what is wrong. Pure.
std::string SpanAbortValue(const watchdog::SpanAbortNotice& notice);
absl::Status ParseSpanAbortValue(const std::string& value, watchdog::SpanAbortNotice* notice);

class SpanAborts final : public watchdog::AbortAnnouncer {
 public:
  // `cluster` must outlive this object, and its etcd client must be shut down (Cluster::Stop)
  // before this object goes: etcd's answers call back into it.
  SpanAborts(Cluster* cluster, SpanAbortsOptions options, prometheus::Registry* registry);
  ~SpanAborts() override;  // Stop()

  // Watches <prefix>/aborts/ from now on: `on_remote` runs (on a gRPC thread, one at a time)
  // for each valid announcement of another node and returns how many groups it aborted. Once.
  void Watch(std::function<int(const watchdog::SpanAbortNotice&)> on_remote);
  // Ends the watch; later announcements fail. Idempotent. Watch and Stop are called from one
  // thread (the daemon's start and shutdown).
  void Stop();

  // A grant of a lease, then the key on it: two etcd calls, never waited for. Disconnected:
  // counted and logged as failed at once, and kept to send when the node is connected again.
  void Announce(watchdog::SpanAbortNotice notice) override;

 private:
  // One announcement: a watched PUT, or a key found by the list before the watch opens.
  void OnAnnounced(const mvccpb::KeyValue& kv);
  void Failed(const watchdog::SpanAbortNotice& notice, const absl::Status& why);
  void ResendPending();

  Cluster* const cluster_;
  const SpanAbortsOptions options_;
  prometheus::Family<prometheus::Counter>& counters_;
  prometheus::Counter* const sent_;
  prometheus::Counter* const send_failures_;
  prometheus::Counter* const received_;
  prometheus::Counter* const applied_;
  prometheus::Counter* const rejected_;
  prometheus::Gauge* const watching_;
  prometheus::Gauge* const pending_gauge_;
  absl::Mutex mu_;
  // Announcements that failed, by key, to send again when the node is connected.
  std::map<std::string, watchdog::SpanAbortNotice> pending_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};
  std::function<int(const watchdog::SpanAbortNotice&)> on_remote_;  // set once, before watch_
  std::unique_ptr<PrefixWatch> watch_;
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_SPAN_ABORTS_H_
