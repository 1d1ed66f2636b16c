// A watch on every key under one prefix that lasts: a thread of its own opens it while the
// cluster is connected, reopens it after a failure (rewatch_interval, jittered by +-50% so that
// the daemons of a cluster do not all come back in the same instant after an etcd restart), and
// resumes from the revision after the last event it delivered, so that events made while this
// node was cut off are still delivered.
//
// With `on_list`, the watch is a list-then-watch (an informer): before its first opening, and
// after etcd cancelled it because the revision it would resume from was compacted away, it
// reads every key under the prefix in one range and hands the answer to `on_list`, then
// watches from the revision after that read. Without `on_list`, a compaction skips what was
// compacted (logged) and the watch goes on from the oldest revision etcd keeps. A reopening
// that etcd can replay costs one count-only read of one key at the resume point (it fails once
// that revision is compacted), never a read of the prefix.
//
//   PrefixWatch watch(cluster, "/commd/dumps/", {.on_event = [](const mvccpb::Event& e) {...}});
//   watch.watching();  // the watch is open now
//
// Thread-safe. The callbacks run on gRPC threads (`on_list` on the watch's own thread), one
// at a time, in revision order.
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

// The revision a watch resumes from after response `r`, given `next`, the one it would resume
// from before it (0: from now). Past the last event delivered; past a progress notification's
// revision (etcd sends one only to a watch that has caught up); for a watch from now, past the
// revision it was created at; on a compaction, the oldest revision etcd keeps. Never past an
// event not yet delivered: a backlog is sent in batches stamped with the store's current
// revision, so a header's revision says nothing of what this watch has seen.
int64_t ResumeRevision(int64_t next, const pb::WatchResponse& r);

struct PrefixWatchCallbacks {
  std::function<void(const mvccpb::Event&)> on_event;
  // Optional: hears each time the watch opens or ends.
  std::function<void(bool open)> on_state;
  // Optional: makes the watch a list-then-watch (above). The range is at most `list_limit`
  // keys (0: no limit); its `more` says whether keys were left out.
  std::function<void(const pb::RangeResponse&)> on_list;
  int64_t list_limit = 0;
};

class PrefixWatch {
 public:
  // Watches from now on (after a first read with `on_list`). `cluster` must outlive this
  // object.
  PrefixWatch(Cluster* cluster, std::string prefix, PrefixWatchCallbacks callbacks,
              absl::Duration rewatch_interval = absl::Milliseconds(200));
  ~PrefixWatch();  // Stop()

  // Ends the watch and waits for its last callback. Idempotent.
  void Stop();
  // The watch is open (etcd confirmed it).
  bool watching() const;

 private:
  void Run();
  // Reads the prefix for on_list and moves next_revision_ past the read; false on failure.
  bool List() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With on_list, before reopening: true (and a list due) when etcd compacted the revision
  // before the resume point, whose changes the watch could then miss without being cancelled.
  bool ResumePointCompacted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnResponse(const pb::WatchResponse& r);
  void SetOpen(bool open);
  absl::Duration Jittered() const;

  Cluster* const cluster_;
  const std::string prefix_;
  const PrefixWatchCallbacks callbacks_;
  const absl::Duration rewatch_interval_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool end_logged_ ABSL_GUARDED_BY(mu_) = false;  // since the watch was last open
  // A list is due before the next opening (with on_list: at first, and after a compaction).
  bool list_due_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<EtcdWatch> watch_ ABSL_GUARDED_BY(mu_);
  int64_t next_revision_ ABSL_GUARDED_BY(mu_) = 0;  // 0: from now
  std::thread thread_;                              // last: started after everything it uses
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_PREFIX_WATCH_H_
