// The job store shared by every node of the cluster: the same operations, limits and
// wording as the node's store (daemon/store/kv_store.h), kept in etcd.
//
// Keys (docs/cluster.md, "etcd keys"):
//   <prefix>/jobs/<uid>/<job>/store/<key>   the job's values
//   <prefix>/jobs/<uid>/<job>/lease         the job's lease id (decimal)
//   <prefix>/usage/<uid>/<job>/<node>       "<keys> <bytes>" the job's store grew by through
//                                           this node (negative when it shrank it)
// All three hang on one lease per job, shared by the nodes: each node keeps it alive while it
// has a session of the job that has used the store, so the job's keys go job_lease_ttl after
// its last rank on every node left (or its last node died), with no node having to be the one
// that deletes them.
//
// Writes are a group commit per job on each node: the writes of a job's ranks that arrive
// while one commit is in flight go together in the next, as one read and one transaction
// conditioned only on the keys they change (and this node's usage key), so the ranks of a node
// never contend with each other, and a node contends with another only over the same key
// (retried after a jittered pause, for up to kContentionLimit). The limits are checked against
// the sum of every node's usage keys as read: nodes committing at the same moment may overshoot
// them by one commit each (docs/cluster.md, "Limits"). A Wait is one etcd watch over the job's
// keys. The
// daemon holds no thread for any call: each answer comes on a gRPC thread through `done`.
// Every call fails UNAVAILABLE naming the endpoint while the cluster is disconnected; the
// node's own store is never used instead. Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_CLUSTER_STORE_H_
#define COMMD_DAEMON_CLUSTER_CLUSTER_STORE_H_

#include <deque>
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
#include "daemon/store/store_backend.h"

namespace commd::cluster {

class ClusterStore final : public store::StoreBackend {
 public:
  // `cluster` and `timers` must outlive the store; Shutdown before destroying it.
  ClusterStore(Cluster* cluster, store::StoreLimits limits, absl::Duration job_lease_ttl,
               server::TimerQueue* timers);
  ~ClusterStore() override;

  // store::StoreBackend, served by store::StoreService.
  void Set(const server::Session& s, const std::string& key, std::string value,
           Done<bool> done) override;
  void Get(const server::Session& s, const std::string& key, Done<std::string> done) override;
  void Add(const server::Session& s, const std::string& key, int64_t delta,
           Done<int64_t> done) override;
  void CompareSet(const server::Session& s, const std::string& key, std::string expected,
                  std::string desired, Done<std::string> done) override;
  void Delete(const server::Session& s, const std::string& key, Done<bool> done) override;
  // `done` runs once (OK when every key exists, DEADLINE_EXCEEDED naming the missing ones, or
  // UNAVAILABLE), unless CancelWait comes first. Argument errors are returned instead.
  absl::StatusOr<store::WaitId> Wait(const server::Session& s, const std::vector<std::string>& keys,
                                     absl::Duration timeout,
                                     std::function<void(absl::Status)> done) override;
  void CancelWait(store::WaitId id) override;

  // The session no longer keeps its job's lease alive from this node.
  void OnSessionEnd(const server::Session& s);
  // Ends the waits (UNAVAILABLE); later calls fail at once.
  void Shutdown();

  size_t waiter_count() const;

  // What a write does to its key; `reply` is what the caller hears.
  struct Change {
    enum Kind { kKeep, kPut, kDelete } kind = kKeep;
    std::string value;
    std::string reply;
    bool existed = false;
  };
  struct Waiter;
  // Keys and bytes of store: a usage key's value, or a sum of them.
  struct Usage {
    int64_t keys = 0;
    int64_t bytes = 0;
    Usage& operator+=(const Usage& o) {
      keys += o.keys;
      bytes += o.bytes;
      return *this;
    }
    Usage operator+(const Usage& o) const { return Usage(*this) += o; }
  };

  // How long a write goes on retrying while other nodes win the same keys.
  static constexpr absl::Duration kContentionLimit = absl::Seconds(30);
  // Distinct keys one commit carries (etcd allows 128 operations per transaction), and the
  // bytes its writes may carry together (etcd refuses requests over --max-request-bytes,
  // 1.5 MiB by default); a write larger than that goes alone.
  static constexpr size_t kKeysPerBatch = 100;
  // Keys per read transaction: etcd accepts at most 128 operations per transaction
  // (--max-txn-ops).
  static constexpr size_t kKeysPerRead = 100;
  static constexpr size_t kBytesPerBatch = 1 << 20;

 private:
  using Compute = std::function<absl::StatusOr<Change>(const std::string* current)>;
  // One write waiting for its commit, and then what it did.
  struct Write {
    std::string key;
    size_t bytes = 0;  // what it may write: the key and the value it brings
    Compute compute;
    Done<Change> done;
    absl::StatusOr<Change> result = absl::UnknownError("not computed");
  };
  // A job's writes on this node: one commit in flight at a time, the rest queued for the next.
  struct Writes {
    std::deque<Write> queued;
    bool committing = false;
  };
  // Validates, notes the session, and hands `then` the job's lease.
  void Begin(const server::Session& s, const std::string& key,
             std::function<void(absl::StatusOr<int64_t>)> then);
  void EnsureLease(const store::Namespace& ns, std::function<void(absl::StatusOr<int64_t>)> then);
  // Queues a write of `key` (`compute` makes the change from the current value) for the job's
  // next commit, and starts one unless one is in flight.
  void Mutate(const store::Namespace& ns, const std::string& key, size_t bytes, Compute compute,
              Done<Change> done);
  // The next commit's writes: the queue's first ones, up to kKeysPerBatch distinct keys and
  // kBytesPerBatch bytes.
  std::vector<Write> TakeBatch(Writes& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the batch's keys and the uid's usage, then Apply.
  void CommitBatch(const store::Namespace& ns, std::vector<Write> batch, int attempt,
                   absl::Time deadline);
  // A batch's keys as the read found them and then as its writes leave them, and the usage.
  struct KeyState {
    std::optional<std::string> value;
    int64_t mod_revision = 0;  // 0: absent when read
    bool changed = false;
  };
  struct BatchState {
    std::map<std::string, KeyState> keys;
    Usage job, uid, node;  // as read: the job's and the uid's sums, this node's own key
    int64_t node_usage_revision = 0;
    Usage added;  // by the batch's writes that passed the limits
  };
  BatchState ReadBatch(const store::Namespace& ns, const std::vector<std::string>& keys,
                       const pb::TxnResponse& read) const;
  // Computes each write in order against `s`, checking the limits; the result of each is kept
  // in its Write, and `s` follows the writes that passed.
  void ComputeWrites(const store::Namespace& ns, BatchState& s, std::vector<Write>& batch) const;
  // Computes the batch against the read and writes its changes unless another node changed
  // one of the keys since the read (then reads again).
  void Apply(const store::Namespace& ns, const std::vector<std::string>& keys,
             const pb::TxnResponse& read, std::vector<Write> batch, int attempt,
             absl::Time deadline);
  // Answers the batch (`failed` instead of each result when not OK) and starts the next one.
  void FinishBatch(const store::Namespace& ns, std::vector<Write> batch,
                   const absl::Status& failed);
  void NextBatch(const store::Namespace& ns);
  absl::Status CheckLimits(const store::Namespace& ns, const Usage& job, const Usage& uid,
                           const Usage& delta) const;
  // The job a usage key under UidUsagePrefix(uid) counts for ("" when it is no usage key).
  std::string JobOfUsageKey(uid_t uid, const std::string& key) const;
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
  std::map<store::Namespace, Writes> writes_ ABSL_GUARDED_BY(mu_);
  // Waits cost the daemon their keys until they end: charged to the uid's and the node's
  // store budgets (limits.per_uid.store_bytes, limits.max_store_bytes).
  UidTally wait_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t wait_bytes_total_ ABSL_GUARDED_BY(mu_) = 0;
  store::WaitId next_wait_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<store::WaitId, std::shared_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_CLUSTER_STORE_H_
