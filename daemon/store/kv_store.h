// The per-job key-value store's data: one map per (uid, job id), limits, and waiters.
//
//   KvStore store(limits, &timers);
//   store.Set(ns, "nccl_id", bytes);
//   store.Wait(ns, {"nccl_id"}, absl::Seconds(30), [](absl::Status s) { ... });
//
// A Wait holds no thread: its callback runs on the thread that sets the last key, on the
// timer thread at the deadline, or never once cancelled. Thread-safe.
#ifndef COMMD_DAEMON_STORE_KV_STORE_H_
#define COMMD_DAEMON_STORE_KV_STORE_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/uid_share.h"
#include "daemon/server/timer_queue.h"

namespace commd::store {

// The config's limits.max_store_* fields; errors name them.
struct StoreLimits {
  uint32_t max_keys_per_job = 65536;
  uint32_t max_key_bytes = 4096;
  uint32_t max_value_bytes = 1 << 20;
  uint64_t max_bytes_per_job = uint64_t{256} << 20;  // keys + values + pending waits' keys
  uint64_t max_bytes = uint64_t{1} << 30;            // over every job
  uint32_t max_keys_per_uid = 65536;                 // limits.per_uid.store_keys
  uint64_t max_bytes_per_uid = uint64_t{256} << 20;  // limits.per_uid.store_bytes
  absl::Duration max_wait = absl::Hours(24);         // groups.max_timeout_ms
};

using Namespace = std::pair<uid_t, std::string>;  // (uid, job id)
using WaitId = uint64_t;

// The store's rules and their wording, shared by the node's store (KvStore) and the
// cluster's (daemon/cluster/cluster_store.h), so a client hears the same either way.
absl::Status CheckStoreKey(const StoreLimits& limits, const std::string& key);
absl::Status CheckStoreValue(const StoreLimits& limits, const std::string& value);
absl::Status CheckStoreWait(const StoreLimits& limits, const std::vector<std::string>& keys,
                            absl::Duration timeout);
// `current` (absent: 0) plus `delta`, as Add stores it.
absl::StatusOr<int64_t> AddToStoreValue(const std::string& key, const std::string* current,
                                        int64_t delta);
absl::Status JobStoreKeysExhausted(const Namespace& ns, uint64_t held, uint64_t limit);
absl::Status JobStoreBytesExhausted(const Namespace& ns, uint64_t would_hold, uint64_t limit);
absl::Status StoreKeyNotFound(const Namespace& ns, const std::string& key);
absl::Status StoreWaitTimedOut(const std::set<std::string>& missing);

class KvStore {
 public:
  // `timers` must outlive the store and be stopped before it is destroyed.
  KvStore(StoreLimits limits, server::TimerQueue* timers);

  absl::Status Set(const Namespace& ns, const std::string& key, std::string value);
  absl::StatusOr<std::string> Get(const Namespace& ns, const std::string& key) const;
  absl::StatusOr<int64_t> Add(const Namespace& ns, const std::string& key, int64_t delta);
  absl::StatusOr<std::string> CompareSet(const Namespace& ns, const std::string& key,
                                         const std::string& expected, std::string desired);
  absl::StatusOr<bool> Delete(const Namespace& ns, const std::string& key);

  // Calls `done` once: OK when every key exists (at once if they already do), or
  // DEADLINE_EXCEEDED naming the missing keys after `timeout`. Errors in the arguments are
  // returned instead, and `done` is not called.
  absl::StatusOr<WaitId> Wait(const Namespace& ns, const std::vector<std::string>& keys,
                              absl::Duration timeout, std::function<void(absl::Status)> done);
  // The waiter is dropped without a call to `done` (its caller went away).
  void CancelWait(WaitId id);

  size_t key_count() const;
  size_t key_count(uid_t uid) const;  // over the uid's jobs
  uint64_t byte_count(uid_t uid) const;
  size_t waiter_count() const;
  uint64_t byte_count() const;  // what counts against limits.max_store_bytes

 private:
  struct Job {
    std::map<std::string, std::string> keys;
    uint64_t bytes = 0;  // keys and values, and the keys its pending waits name
  };
  struct Waiter {
    Namespace ns;
    std::set<std::string> missing;
    uint64_t charged = 0;  // bytes it holds of its job's budget
    std::function<void(absl::Status)> done;
    server::TimerId timer = 0;
  };
  // Counts `bytes` more against the job's and the node's budgets, or fails naming the limit.
  absl::Status Charge(const Namespace& ns, Job& job, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const Namespace& ns, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value` (checking limits) and collects the waiters it completes.
  absl::Status Put(const Namespace& ns, const std::string& key, std::string value,
                   std::vector<std::function<void()>>* completed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the waiter out (releasing what it charged); nullopt if it already finished.
  std::optional<Waiter> TakeWaiter(WaitId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnTimeout(WaitId id);

  const StoreLimits limits_;
  server::TimerQueue* const timers_;
  mutable absl::Mutex mu_;
  // A job is present while it holds a key or a pending wait, so that jobs that come and go
  // leave nothing behind.
  std::map<Namespace, Job> jobs_ ABSL_GUARDED_BY(mu_);
  size_t keys_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Over every job of a uid: a user's many job ids share one budget.
  UidTally uid_keys_ ABSL_GUARDED_BY(mu_);
  UidTally uid_bytes_ ABSL_GUARDED_BY(mu_);
  WaitId next_wait_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<WaitId, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::store

#endif  // COMMD_DAEMON_STORE_KV_STORE_H_
