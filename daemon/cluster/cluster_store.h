// The job store shared by every node of the cluster: the same operations, limits and
// wording as the node's store (daemon/store/kv_store.h), kept in etcd.
//
// Keys (docs/cluster.md, "etcd keys"):
//   <prefix>/jobs/<uid>/<job>/store/<key>   the job's values
//   <prefix>/jobs/<uid>/<job>/lease         the job's lease id (decimal)
//   <prefix>/usage/<uid>/<job>              "<keys> <bytes>" the job's store holds
// All three hang on one lease per job, shared by the nodes: each node keeps it alive while it
// has a session of the job that has used the store, so the job's keys go job_lease_ttl after
// its last rank on every node left (or its last node died), with no node having to be the one
// that deletes them.
//
// Writes are compare-and-swap transactions over the uid's usage keys, so the per-job and
// per-uid limits hold across nodes exactly; a Wait is one etcd watch over the job's keys. The
// daemon holds no thread for any call: each answer comes on a gRPC thread through `done`.
// Every call fails UNAVAILABLE naming the endpoint while the cluster is disconnected; the
// node's own store is never used instead. Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_CLUSTER_STORE_H_
#define COMMD_DAEMON_CLUSTER_CLUSTER_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/uid_share.h"
#include "daemon/cluster/cluster.h"
#include "daemon/server/sessions.h"
#include "daemon/server/timer_queue.h"
#include "daemon/store/kv_store.h"

namespace commd::cluster {

class ClusterStore {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  // `cluster` and `timers` must outlive the store; Shutdown before destroying it.
  ClusterStore(Cluster* cluster, store::StoreLimits limits, absl::Duration job_lease_ttl,
               server::TimerQueue* timers);
  ~ClusterStore();

  void Set(const server::Session& s, const std::string& key, std::string value, Done<bool> done);
  void Get(const server::Session& s, const std::string& key, Done<std::string> done);
  void Add(const server::Session& s, const std::string& key, int64_t delta, Done<int64_t> done);
  void CompareSet(const server::Session& s, const std::string& key, std::string expected,
                  std::string desired, Done<std::string> done);
  void Delete(const server::Session& s, const std::string& key, Done<bool> done);
  // `done` runs once (OK when every key exists, DEADLINE_EXCEEDED naming the missing ones, or
  // UNAVAILABLE), unless CancelWait comes first. Argument errors are returned instead.
  absl::StatusOr<store::WaitId> Wait(const server::Session& s, const std::vector<std::string>& keys,
                                     absl::Duration timeout,
                                     std::function<void(absl::Status)> done);
  void CancelWait(store::WaitId id);

  // The session no longer keeps its job's lease alive from this node.
  void OnSessionEnd(const server::Session& s);
  // Ends the waits (UNAVAILABLE); later calls fail at once.
  void Shutdown();

  size_t waiter_count() const;

  struct Change;
  struct Waiter;

 private:
  using Compute = std::function<absl::StatusOr<Change>(const std::string* current)>;
  // Validates, notes the session, and hands `then` the job's lease.
  void Begin(const server::Session& s, const std::string& key,
             std::function<void(absl::StatusOr<int64_t>)> then);
  void EnsureLease(const store::Namespace& ns, std::function<void(absl::StatusOr<int64_t>)> then);
  // Compare-and-swap loop: reads the key and the uid's usage, applies `compute`, checks the
  // limits, writes if nothing moved meanwhile; else reads again.
  void Mutate(const store::Namespace& ns, const std::string& key, Compute compute,
              Done<Change> done, int attempt);
  void Commit(const store::Namespace& ns, const std::string& key, const pb::TxnResponse& read,
              Compute compute, Done<Change> done, int attempt);
  absl::Status CheckLimits(const store::Namespace& ns, const pb::RangeResponse& usage,
                           int64_t add_keys, int64_t add_bytes) const;
  void LeaseLost(const store::Namespace& ns, int64_t lease);
  void CheckWaitedKeys(std::shared_ptr<Waiter> w, std::vector<std::string> keys, size_t from);
  void FinishWait(const std::shared_ptr<Waiter>& w, absl::Status status);

  std::string JobPrefix(const store::Namespace& ns) const;
  std::string StoreKey(const store::Namespace& ns, const std::string& key) const;
  std::string UsageKey(const store::Namespace& ns) const;
  std::string UidUsagePrefix(uid_t uid) const;

  Cluster* const cluster_;
  const store::StoreLimits limits_;
  const absl::Duration job_lease_ttl_;
  server::TimerQueue* const timers_;

  struct Job {
    int64_t lease = 0;
    std::set<std::string> sessions;  // tokens of this node's sessions that used the store
  };
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<store::Namespace, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // Waits cost the daemon their keys until they end: charged to the uid's and the node's
  // store budgets (limits.per_uid.store_bytes, limits.max_store_bytes).
  UidTally wait_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t wait_bytes_total_ ABSL_GUARDED_BY(mu_) = 0;
  store::WaitId next_wait_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<store::WaitId, std::shared_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_CLUSTER_STORE_H_
