#include "daemon/cluster/cluster_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::cluster {

// What a write does to its key; `reply` is what the caller hears.
struct ClusterStore::Change {
  enum Kind { kKeep, kPut, kDelete } kind = kKeep;
  std::string value;
  std::string reply;
  bool existed = false;
};

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

namespace {

// Concurrent writers of one uid's keys make a transaction fail and read again; a write that
// loses this many times in a row reports the contention instead of looping on.
constexpr int kMaxAttempts = 64;
// etcd accepts at most 128 operations per transaction (--max-txn-ops).
constexpr size_t kKeysPerRead = 100;

struct Usage {
  int64_t keys = 0;
  int64_t bytes = 0;
};

Usage ParseUsage(const std::string& value) {
  Usage u;
  std::vector<absl::string_view> parts = absl::StrSplit(value, ' ');
  if (parts.size() == 2) {
    (void)absl::SimpleAtoi(parts[0], &u.keys);
    (void)absl::SimpleAtoi(parts[1], &u.bytes);
  }
  return u;
}

bool IsLeaseGone(const absl::Status& s) {
  return absl::IsNotFound(s) && absl::StrContains(s.message(), "lease not found");
}

}  // namespace

ClusterStore::ClusterStore(Cluster* cluster, store::StoreLimits limits,
                           absl::Duration job_lease_ttl, server::TimerQueue* timers)
    : cluster_(cluster), limits_(limits), job_lease_ttl_(job_lease_ttl), timers_(timers) {
  cluster_->AddLeaseSource(LeaseSource{.ids =
                                           [this] {
                                             absl::MutexLock lock(&mu_);
                                             std::vector<int64_t> ids;
                                             for (const auto& [ns, job] : jobs_) {
                                               if (job.lease != 0) ids.push_back(job.lease);
                                             }
                                             return ids;
                                           },
                                       .refreshed =
                                           [this](int64_t id, int64_t ttl) {
                                             if (ttl > 0) return;
                                             absl::MutexLock lock(&mu_);
                                             for (auto& [ns, job] : jobs_) {
                                               if (job.lease == id)
                                                 job.lease =
                                                     0;  // expired: the next call makes a new one
                                             }
                                           }});
}

ClusterStore::~ClusterStore() { Shutdown(); }

std::string ClusterStore::JobPrefix(const store::Namespace& ns) const {
  return absl::StrCat(cluster_->options().prefix, "/jobs/", ns.first, "/", ns.second, "/");
}
std::string ClusterStore::StoreKey(const store::Namespace& ns, const std::string& key) const {
  return absl::StrCat(JobPrefix(ns), "store/", key);
}
std::string ClusterStore::UsageKey(const store::Namespace& ns) const {
  return absl::StrCat(UidUsagePrefix(ns.first), ns.second);
}
std::string ClusterStore::UidUsagePrefix(uid_t uid) const {
  return absl::StrCat(cluster_->options().prefix, "/usage/", uid, "/");
}

void ClusterStore::Begin(const server::Session& s, const std::string& key,
                         std::function<void(absl::StatusOr<int64_t>)> then) {
  if (absl::Status st = store::CheckStoreKey(limits_, key); !st.ok()) return then(st);
  const store::Namespace ns{s.uid, s.job_id};
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return then(absl::UnavailableError("the daemon is shutting down"));
    jobs_[ns].sessions.insert(s.token);
  }
  // A disconnected cluster fails at once, naming why, instead of after call_timeout_ms.
  if (!cluster_->connected()) return then(cluster_->Unavailable());
  EnsureLease(ns, std::move(then));
}

void ClusterStore::EnsureLease(const store::Namespace& ns,
                               std::function<void(absl::StatusOr<int64_t>)> then) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(ns);
    if (it != jobs_.end() && it->second.lease != 0) return then(it->second.lease);
  }
  // Grant a lease and publish it unless another node did first; then use the published one.
  cluster_->etcd().LeaseGrant(
      LeaseSeconds(job_lease_ttl_),
      [this, ns, then = std::move(then)](absl::StatusOr<pb::LeaseGrantResponse> granted) {
        if (!granted.ok()) return then(granted.status());
        const std::string key = JobPrefix(ns) + "lease";
        pb::TxnRequest txn;
        pb::Compare* absent = txn.add_compare();
        absent->set_key(key);
        absent->set_target(pb::Compare::VERSION);
        absent->set_version(0);
        pb::PutRequest* put = txn.add_success()->mutable_request_put();
        put->set_key(key);
        put->set_value(absl::StrCat(granted->id()));
        put->set_lease(granted->id());
        txn.add_failure()->mutable_request_range()->set_key(key);
        const int64_t mine = granted->id();
        cluster_->etcd().Txn(txn, [this, ns, mine, then](absl::StatusOr<pb::TxnResponse> r) {
          int64_t lease = mine;
          if (r.ok() && !r->succeeded()) {
            const auto& kvs = r->responses(0).response_range().kvs();
            if (kvs.empty() || !absl::SimpleAtoi(kvs[0].value(), &lease)) lease = 0;
          }
          if (!r.ok() || lease != mine) {
            cluster_->etcd().LeaseRevoke(mine, [](auto) {});
          }
          if (!r.ok()) return then(r.status());
          // The published lease vanished between the two steps: take a fresh one.
          if (lease == 0) return EnsureLease(ns, then);
          {
            absl::MutexLock lock(&mu_);
            auto it = jobs_.find(ns);
            if (it != jobs_.end()) it->second.lease = lease;
          }
          then(lease);
        });
      });
}

void ClusterStore::LeaseLost(const store::Namespace& ns, int64_t lease) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(ns);
  if (it != jobs_.end() && it->second.lease == lease) it->second.lease = 0;
}

void ClusterStore::Mutate(const store::Namespace& ns, const std::string& key, Compute compute,
                          Done<Change> done, int attempt) {
  pb::TxnRequest read;
  read.add_success()->mutable_request_range()->set_key(StoreKey(ns, key));
  pb::RangeRequest* usage = read.add_success()->mutable_request_range();
  usage->set_key(UidUsagePrefix(ns.first));
  usage->set_range_end(PrefixEnd(UidUsagePrefix(ns.first)));
  cluster_->etcd().Txn(read, [this, ns, key, compute = std::move(compute), done = std::move(done),
                              attempt](absl::StatusOr<pb::TxnResponse> r) mutable {
    if (!r.ok()) return done(r.status());
    Commit(ns, key, *r, std::move(compute), std::move(done), attempt);
  });
}

absl::Status ClusterStore::CheckLimits(const store::Namespace& ns, const pb::RangeResponse& usage,
                                       int64_t add_keys, int64_t add_bytes) const {
  Usage job, uid;
  for (const auto& kv : usage.kvs()) {
    const Usage u = ParseUsage(kv.value());
    if (kv.key() == UsageKey(ns)) job = u;
    uid.keys += u.keys;
    uid.bytes += u.bytes;
  }
  if (add_keys > 0 && static_cast<uint64_t>(job.keys) >= limits_.max_keys_per_job) {
    return store::JobStoreKeysExhausted(ns, job.keys, limits_.max_keys_per_job);
  }
  if (add_keys > 0 && static_cast<uint64_t>(uid.keys) >= limits_.max_keys_per_uid) {
    return UidShareExhausted(ns.first, uid.keys, limits_.max_keys_per_uid, "store keys",
                             "store_keys");
  }
  if (add_bytes > 0 && static_cast<uint64_t>(job.bytes + add_bytes) > limits_.max_bytes_per_job) {
    return store::JobStoreBytesExhausted(ns, job.bytes + add_bytes, limits_.max_bytes_per_job);
  }
  if (add_bytes > 0 && static_cast<uint64_t>(uid.bytes + add_bytes) > limits_.max_bytes_per_uid) {
    return UidShareExhausted(ns.first, absl::StrCat(uid.bytes),
                             absl::StrCat(limits_.max_bytes_per_uid), "bytes of store",
                             "store_bytes", absl::StrCat(add_bytes));
  }
  return absl::OkStatus();
}

void ClusterStore::Commit(const store::Namespace& ns, const std::string& key,
                          const pb::TxnResponse& read, Compute compute, Done<Change> done,
                          int attempt) {
  const auto& kvs = read.responses(0).response_range().kvs();
  const std::string* current = kvs.empty() ? nullptr : &kvs[0].value();
  absl::StatusOr<Change> change = compute(current);
  if (!change.ok() || change->kind == Change::kKeep) return done(std::move(change));
  change->existed = current != nullptr;
  int64_t add_keys = 0, add_bytes = 0;
  const int64_t old_bytes = current == nullptr ? 0 : key.size() + current->size();
  if (change->kind == Change::kPut) {
    if (absl::Status s = store::CheckStoreValue(limits_, change->value); !s.ok()) return done(s);
    add_keys = current == nullptr ? 1 : 0;
    add_bytes = static_cast<int64_t>(key.size() + change->value.size()) - old_bytes;
  } else {
    add_keys = current == nullptr ? 0 : -1;
    add_bytes = -old_bytes;
  }
  const pb::RangeResponse& usage = read.responses(1).response_range();
  if (absl::Status s = CheckLimits(ns, usage, add_keys, add_bytes); !s.ok()) return done(s);
  Usage job;
  for (const auto& kv : usage.kvs()) {
    if (kv.key() == UsageKey(ns)) job = ParseUsage(kv.value());
  }
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(ns);
    lease = it == jobs_.end() ? 0 : it->second.lease;
  }
  // Nothing of the uid's usage moved since the read: every write of the uid changes it.
  pb::TxnRequest txn;
  pb::Compare* unmoved = txn.add_compare();
  unmoved->set_key(UidUsagePrefix(ns.first));
  unmoved->set_range_end(PrefixEnd(UidUsagePrefix(ns.first)));
  unmoved->set_target(pb::Compare::MOD);
  unmoved->set_result(pb::Compare::LESS);
  unmoved->set_mod_revision(read.header().revision() + 1);
  if (change->kind == Change::kPut) {
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(StoreKey(ns, key));
    put->set_value(change->value);
    put->set_lease(lease);
  } else {
    txn.add_success()->mutable_request_delete_range()->set_key(StoreKey(ns, key));
  }
  pb::PutRequest* put_usage = txn.add_success()->mutable_request_put();
  put_usage->set_key(UsageKey(ns));
  put_usage->set_value(absl::StrCat(job.keys + add_keys, " ", job.bytes + add_bytes));
  put_usage->set_lease(lease);
  cluster_->etcd().Txn(
      txn, [this, ns, key, lease, change = *std::move(change), compute = std::move(compute),
            done = std::move(done), attempt](absl::StatusOr<pb::TxnResponse> r) mutable {
        if (r.ok() && r->succeeded()) return done(std::move(change));
        if (!r.ok() && !IsLeaseGone(r.status())) return done(r.status());
        if (attempt + 1 >= kMaxAttempts) {
          return done(absl::AbortedError(absl::StrCat("store key ", QuoteForError(key), " of job '",
                                                      ns.second, "': ", kMaxAttempts,
                                                      " concurrent writers won in a row; retry")));
        }
        if (r.ok()) return Mutate(ns, key, std::move(compute), std::move(done), attempt + 1);
        // The job's lease expired under us: take a new one and write again.
        LeaseLost(ns, lease);
        EnsureLease(ns, [this, ns, key, compute = std::move(compute), done = std::move(done),
                         attempt](absl::StatusOr<int64_t> l) mutable {
          if (!l.ok()) return done(l.status());
          Mutate(ns, key, std::move(compute), std::move(done), attempt + 1);
        });
      });
}

void ClusterStore::Set(const server::Session& s, const std::string& key, std::string value,
                       Done<bool> done) {
  if (absl::Status st = store::CheckStoreValue(limits_, value); !st.ok()) return done(st);
  const store::Namespace ns{s.uid, s.job_id};
  Begin(s, key,
        [this, ns, key, value = std::move(value),
         done = std::move(done)](absl::StatusOr<int64_t> lease) mutable {
          if (!lease.ok()) return done(lease.status());
          Mutate(
              ns, key,
              [value = std::move(value)](const std::string*) -> absl::StatusOr<Change> {
                return Change{.kind = Change::kPut, .value = value};
              },
              [done = std::move(done)](absl::StatusOr<Change> c) {
                if (!c.ok()) return done(c.status());
                done(true);
              },
              0);
        });
}

void ClusterStore::Get(const server::Session& s, const std::string& key, Done<std::string> done) {
  const store::Namespace ns{s.uid, s.job_id};
  Begin(s, key, [this, ns, key, done = std::move(done)](absl::StatusOr<int64_t> lease) mutable {
    if (!lease.ok()) return done(lease.status());
    pb::RangeRequest range;
    range.set_key(StoreKey(ns, key));
    cluster_->etcd().Range(range,
                           [ns, key, done = std::move(done)](absl::StatusOr<pb::RangeResponse> r) {
                             if (!r.ok()) return done(r.status());
                             if (r->kvs().empty()) return done(store::StoreKeyNotFound(ns, key));
                             done(r->kvs(0).value());
                           });
  });
}

void ClusterStore::Add(const server::Session& s, const std::string& key, int64_t delta,
                       Done<int64_t> done) {
  const store::Namespace ns{s.uid, s.job_id};
  Begin(s, key, [this, ns, key, delta, done = std::move(done)](absl::StatusOr<int64_t> l) mutable {
    if (!l.ok()) return done(l.status());
    Mutate(
        ns, key,
        [key, delta](const std::string* current) -> absl::StatusOr<Change> {
          ASSIGN_OR_RETURN(int64_t sum, store::AddToStoreValue(key, current, delta));
          return Change{.kind = Change::kPut, .value = absl::StrCat(sum)};
        },
        [done = std::move(done)](absl::StatusOr<Change> c) {
          if (!c.ok()) return done(c.status());
          int64_t sum = 0;
          (void)absl::SimpleAtoi(c->value, &sum);
          done(sum);
        },
        0);
  });
}

void ClusterStore::CompareSet(const server::Session& s, const std::string& key,
                              std::string expected, std::string desired, Done<std::string> done) {
  const store::Namespace ns{s.uid, s.job_id};
  Begin(s, key,
        [this, ns, key, expected = std::move(expected), desired = std::move(desired),
         done = std::move(done)](absl::StatusOr<int64_t> l) mutable {
          if (!l.ok()) return done(l.status());
          Mutate(
              ns, key,
              [expected, desired](const std::string* current) -> absl::StatusOr<Change> {
                const bool matches = current == nullptr ? expected.empty() : *current == expected;
                if (!matches) return Change{.reply = current == nullptr ? "" : *current};
                return Change{.kind = Change::kPut, .value = desired, .reply = desired};
              },
              [done = std::move(done)](absl::StatusOr<Change> c) {
                if (!c.ok()) return done(c.status());
                done(c->reply);
              },
              0);
        });
}

void ClusterStore::Delete(const server::Session& s, const std::string& key, Done<bool> done) {
  const store::Namespace ns{s.uid, s.job_id};
  Begin(s, key, [this, ns, key, done = std::move(done)](absl::StatusOr<int64_t> l) mutable {
    if (!l.ok()) return done(l.status());
    Mutate(
        ns, key,
        [](const std::string* current) -> absl::StatusOr<Change> {
          if (current == nullptr) return Change{};
          return Change{.kind = Change::kDelete};
        },
        [done = std::move(done)](absl::StatusOr<Change> c) {
          if (!c.ok()) return done(c.status());
          done(c->existed);
        },
        0);
  });
}

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
