// ClusterStore's waits (cluster_store.h): a wait for keys of a job's store, answered by one
// read and, while keys are missing, a watch of the job's keys; its deadline, cancellation and
// the daemon's shutdown end it. Also the end of a session (the job's lease is no longer
// refreshed by this node) and of the store.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/cluster/cluster_store.h"

namespace commd::cluster {

struct ClusterStore::Waiter {
  store::Namespace ns;
  absl::Mutex mu;
  bool finished ABSL_GUARDED_BY(mu) = false;
  std::set<std::string> missing ABSL_GUARDED_BY(mu);
  std::function<void(absl::Status)> done ABSL_GUARDED_BY(mu);
  server::TimerId timer ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<EtcdWatch> watch ABSL_GUARDED_BY(mu);
  uint64_t charged = 0;
  store::WaitId id = 0;
};

absl::StatusOr<store::WaitId> ClusterStore::Wait(const server::Session& s,
                                                 const std::vector<std::string>& keys,
                                                 absl::Duration timeout,
                                                 std::function<void(absl::Status)> done) {
  RETURN_IF_ERROR(store::CheckStoreWait(limits_, keys, timeout));
  auto w = std::make_shared<Waiter>();
  w->ns = {s.uid, s.job_id};
  {
    absl::MutexLock wl(&w->mu);
    w->done = std::move(done);
    w->missing.insert(keys.begin(), keys.end());
    for (const std::string& key : w->missing) w->charged += key.size();
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
    if (const uint64_t held = wait_bytes_.of(s.uid);
        held + w->charged > limits_.max_bytes_per_uid) {
      return UidShareExhausted(s.uid, absl::StrCat(held), absl::StrCat(limits_.max_bytes_per_uid),
                               "bytes of store", "store_bytes", absl::StrCat(w->charged));
    }
    if (wait_bytes_total_ + w->charged > limits_.max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the store waits of all jobs would hold ", wait_bytes_total_ + w->charged,
                       " bytes, over limits.max_store_bytes ", limits_.max_bytes));
    }
    wait_bytes_.Add(s.uid, w->charged);
    wait_bytes_total_ += w->charged;
    w->id = next_wait_++;
    waiters_.emplace(w->id, w);
    jobs_[w->ns].sessions.insert(s.token);
  }
  const server::TimerId timer = timers_->Schedule(absl::Now() + timeout, [this, w] {
    std::set<std::string> missing;
    {
      absl::MutexLock wl(&w->mu);
      missing = w->missing;
    }
    FinishWait(w, store::StoreWaitTimedOut(missing));
  });
  {
    absl::MutexLock wl(&w->mu);
    w->timer = timer;
  }
  if (!cluster_->connected()) {
    FinishWait(w, cluster_->Unavailable());
    return w->id;
  }
  // The watch first, then the check of what exists: a key written between the two is seen by
  // one or the other.
  const std::string prefix = JobPrefix(w->ns) + "store/";
  pb::WatchCreateRequest create;
  create.set_key(prefix);
  create.set_range_end(PrefixEnd(prefix));
  auto watch = cluster_->etcd().Watch(
      create,
      [this, w, prefix, keys](const pb::WatchResponse& r) {
        if (r.created()) return CheckWaitedKeys(w, keys, 0);
        if (r.canceled()) {
          return FinishWait(w, absl::UnavailableError(absl::StrCat(
                                   "etcd at ", cluster_->etcd().endpoint(),
                                   " cancelled the store watch: ", r.cancel_reason())));
        }
        bool complete = false;
        {
          absl::MutexLock wl(&w->mu);
          for (const auto& e : r.events()) {
            if (e.type() == mvccpb::Event::PUT)
              w->missing.erase(e.kv().key().substr(prefix.size()));
          }
          complete = w->missing.empty();
        }
        if (complete) FinishWait(w, absl::OkStatus());
      },
      [this, w](absl::Status end) {
        if (!end.ok()) FinishWait(w, end);
      });
  absl::MutexLock wl(&w->mu);
  if (w->finished) {
    if (watch != nullptr) watch->Cancel();
  } else {
    w->watch = std::move(watch);
  }
  return w->id;
}

void ClusterStore::CheckWaitedKeys(std::shared_ptr<Waiter> w, std::vector<std::string> keys,
                                   size_t from) {
  if (from >= keys.size()) {
    bool complete;
    {
      absl::MutexLock wl(&w->mu);
      complete = w->missing.empty();
    }
    if (complete) FinishWait(w, absl::OkStatus());
    return;
  }
  pb::TxnRequest txn;
  const size_t to = std::min(keys.size(), from + kKeysPerRead);
  for (size_t i = from; i < to; ++i) {
    pb::RangeRequest* range = txn.add_success()->mutable_request_range();
    range->set_key(StoreKey(w->ns, keys[i]));
    range->set_count_only(true);
  }
  cluster_->etcd().Txn(
      txn, [this, w, keys = std::move(keys), from, to](absl::StatusOr<pb::TxnResponse> r) mutable {
        if (!r.ok()) return FinishWait(w, r.status());
        {
          absl::MutexLock wl(&w->mu);
          for (size_t i = from; i < to; ++i) {
            if (r->responses(static_cast<int>(i - from)).response_range().count() > 0) {
              w->missing.erase(keys[i]);
            }
          }
        }
        CheckWaitedKeys(std::move(w), std::move(keys), to);
      });
}

void ClusterStore::FinishWait(const std::shared_ptr<Waiter>& w, absl::Status status) {
  std::shared_ptr<EtcdWatch> watch;
  std::function<void(absl::Status)> done;
  server::TimerId timer;
  {
    absl::MutexLock wl(&w->mu);
    if (w->finished) return;
    w->finished = true;
    watch = std::move(w->watch);
    done = std::move(w->done);
    timer = w->timer;
  }
  if (timer != 0) timers_->Cancel(timer);
  if (watch != nullptr) watch->Cancel();
  {
    absl::MutexLock lock(&mu_);
    waiters_.erase(w->id);
    wait_bytes_.Sub(w->ns.first, w->charged);
    wait_bytes_total_ -= w->charged;
  }
  if (done) done(std::move(status));
}

void ClusterStore::CancelWait(store::WaitId id) {
  std::shared_ptr<Waiter> w;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    w = it->second;
  }
  {
    absl::MutexLock wl(&w->mu);
    w->done = nullptr;  // the caller went away: nobody to answer
  }
  FinishWait(w, absl::CancelledError("cancelled"));
}

void ClusterStore::OnSessionEnd(const server::Session& s) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find({s.uid, s.job_id});
  if (it == jobs_.end()) return;
  it->second.sessions.erase(s.token);
  // This node stops refreshing the job's lease; the other nodes' ranks keep it alive.
  if (it->second.sessions.empty()) jobs_.erase(it);
}

void ClusterStore::Shutdown() {
  std::vector<std::shared_ptr<Waiter>> waiters;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, w] : waiters_) waiters.push_back(w);
  }
  for (auto& w : waiters) FinishWait(w, absl::UnavailableError("the daemon is shutting down"));
}

size_t ClusterStore::waiter_count() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace commd::cluster
