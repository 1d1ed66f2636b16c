// A watch on every key under one prefix that lasts: a thread of its own opens it while the
// cluster is connected, reopens it rewatch_interval after a failure, and resumes from the revision
// after the last one it saw, so that events made while this node was cut off are still delivered
// (unless etcd compacted them away first, which is logged).
//
//   PrefixWatch watch(cluster, "/commd/dumps/", [](const mvccpb::Event& e) { ... }, nullptr);
//   watch.watching();  // the watch is open now
//
// Thread-safe. `on_event` runs on gRPC threads, one response at a time.
#ifndef COMMD_DAEMON_CLUSTER_PREFIX_WATCH_H_
#define COMMD_DAEMON_CLUSTER_PREFIX_WATCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"

namespace commd::cluster {

class PrefixWatch {
 public:
  // Watches from now on; `on_state(open)` (optional) hears each time the watch opens or ends
  // (on gRPC threads). `cluster` must outlive this object.
  PrefixWatch(Cluster* cluster, std::string prefix,
              std::function<void(const mvccpb::Event&)> on_event,
              std::function<void(bool open)> on_state = nullptr,
              absl::Duration rewatch_interval = absl::Milliseconds(200));
  ~PrefixWatch();  // Stop()

  // Ends the watch and waits for its last callback. Idempotent.
  void Stop();
  // The watch is open (etcd confirmed it).
  bool watching() const;

 private:
  void Run();
  void StartWatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnResponse(const pb::WatchResponse& r);
  void SetOpen(bool open);

  Cluster* const cluster_;
  const std::string prefix_;
  const std::function<void(const mvccpb::Event&)> on_event_;
  const std::function<void(bool)> on_state_;
  const absl::Duration rewatch_interval_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<EtcdWatch> watch_ ABSL_GUARDED_BY(mu_);
  int64_t next_revision_ ABSL_GUARDED_BY(mu_) = 0;  // 0: from now
  std::thread thread_;                              // last: started after everything it uses
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_PREFIX_WATCH_H_
