#include "daemon/cluster/cluster_store.h"

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::cluster {

namespace {

using Usage = ClusterStore::Usage;

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

// The pause before the `attempt`th retry of a commit another node beat: doubling from 2 ms up to
// 500 ms, each drawn from half to one and a half of that.
absl::Duration Backoff(int attempt) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  const absl::Duration base = std::min(absl::Milliseconds(2) * (int64_t{1} << std::min(attempt, 8)),
                                       absl::Milliseconds(500));
  return base * std::uniform_real_distribution<double>(0.5, 1.5)(random);
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
  return absl::StrCat(UidUsagePrefix(ns.first), ns.second, "/", cluster_->options().node_name);
}
std::string ClusterStore::JobOfUsageKey(uid_t uid, const std::string& key) const {
  const std::string prefix = UidUsagePrefix(uid);
  if (!absl::StartsWith(key, prefix)) return "";
  // <job>/<node>; a daemon before per-node usage wrote <job> alone. Job ids hold no '/'.
  const std::string rest = key.substr(prefix.size());
  return rest.substr(0, rest.find('/'));
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
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(ns);
    if (it != jobs_.end()) lease = it->second.lease;
  }
  if (lease != 0) return then(lease);  // unlocked: `then` may take mu_
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

absl::Status ClusterStore::CheckLimits(const store::Namespace& ns, const Usage& job,
                                       const Usage& uid, const Usage& delta) const {
  if (delta.keys > 0 && static_cast<uint64_t>(job.keys) >= limits_.max_keys_per_job) {
    return store::JobStoreKeysExhausted(ns, job.keys, limits_.max_keys_per_job);
  }
  if (delta.keys > 0 && static_cast<uint64_t>(uid.keys) >= limits_.max_keys_per_uid) {
    return UidShareExhausted(ns.first, uid.keys, limits_.max_keys_per_uid, "store keys",
                             "store_keys");
  }
  if (delta.bytes > 0 &&
      static_cast<uint64_t>(job.bytes + delta.bytes) > limits_.max_bytes_per_job) {
    return store::JobStoreBytesExhausted(ns, job.bytes + delta.bytes, limits_.max_bytes_per_job);
  }
  if (delta.bytes > 0 &&
      static_cast<uint64_t>(uid.bytes + delta.bytes) > limits_.max_bytes_per_uid) {
    return UidShareExhausted(ns.first, absl::StrCat(uid.bytes),
                             absl::StrCat(limits_.max_bytes_per_uid), "bytes of store",
                             "store_bytes", absl::StrCat(delta.bytes));
  }
  return absl::OkStatus();
}

void ClusterStore::Mutate(const store::Namespace& ns, const std::string& key, size_t bytes,
                          Compute compute, Done<Change> done) {
  std::vector<Write> batch;
  {
    absl::MutexLock lock(&mu_);
    Writes& w = writes_[ns];
    w.queued.push_back({.key = key,
                        .bytes = key.size() + bytes,
                        .compute = std::move(compute),
                        .done = std::move(done)});
    if (w.committing) return;  // the batch in flight takes it next
    w.committing = true;
    batch = TakeBatch(w);
  }
  CommitBatch(ns, std::move(batch), 0, absl::Now() + kContentionLimit);
}

std::vector<ClusterStore::Write> ClusterStore::TakeBatch(Writes& w) {
  std::vector<Write> batch;
  std::set<std::string> keys;
  size_t bytes = 0;
  while (!w.queued.empty()) {
    const std::string& key = w.queued.front().key;
    if (!keys.contains(key) && keys.size() == kKeysPerBatch) break;
    if (!batch.empty() && bytes + w.queued.front().bytes > kBytesPerBatch) break;
    bytes += w.queued.front().bytes;
    keys.insert(key);
    batch.push_back(std::move(w.queued.front()));
    w.queued.pop_front();
  }
  return batch;
}

void ClusterStore::NextBatch(const store::Namespace& ns) {
  std::vector<Write> batch;
  {
    absl::MutexLock lock(&mu_);
    auto it = writes_.find(ns);
    if (it->second.queued.empty()) {
      writes_.erase(it);
      return;
    }
    batch = TakeBatch(it->second);
  }
  CommitBatch(ns, std::move(batch), 0, absl::Now() + kContentionLimit);
}

void ClusterStore::FinishBatch(const store::Namespace& ns, std::vector<Write> batch,
                               const absl::Status& failed) {
  for (Write& w : batch) {
    w.done(failed.ok() ? std::move(w.result) : absl::StatusOr<Change>(failed));
  }
  NextBatch(ns);
}

void ClusterStore::CommitBatch(const store::Namespace& ns, std::vector<Write> batch, int attempt,
                               absl::Time deadline) {
  // One read: every key of the batch, and the uid's usage keys (every job, every node).
  pb::TxnRequest read;
  std::vector<std::string> keys;
  for (const Write& w : batch) {
    if (std::find(keys.begin(), keys.end(), w.key) != keys.end()) continue;
    keys.push_back(w.key);
    read.add_success()->mutable_request_range()->set_key(StoreKey(ns, w.key));
  }
  pb::RangeRequest* usage = read.add_success()->mutable_request_range();
  usage->set_key(UidUsagePrefix(ns.first));
  usage->set_range_end(PrefixEnd(UidUsagePrefix(ns.first)));
  cluster_->etcd().Txn(read, [this, ns, keys = std::move(keys), batch = std::move(batch), attempt,
                              deadline](absl::StatusOr<pb::TxnResponse> r) mutable {
    if (absl::IsResourceExhausted(r.status()) && keys.size() > 1) {
      // The keys' current values together are more than one answer may bring
      // (EtcdOptions::max_receive_bytes): the second half goes first in the queue.
      const auto half = batch.begin() + static_cast<std::ptrdiff_t>(batch.size() / 2);
      {
        absl::MutexLock lock(&mu_);
        std::deque<Write>& queued = writes_[ns].queued;
        queued.insert(queued.begin(), std::make_move_iterator(half),
                      std::make_move_iterator(batch.end()));
      }
      batch.erase(half, batch.end());
      return CommitBatch(ns, std::move(batch), attempt, deadline);
    }
    if (!r.ok()) return FinishBatch(ns, std::move(batch), r.status());
    Apply(ns, keys, *r, std::move(batch), attempt, deadline);
  });
}

ClusterStore::BatchState ClusterStore::ReadBatch(const store::Namespace& ns,
                                                 const std::vector<std::string>& keys,
                                                 const pb::TxnResponse& read) const {
  BatchState s;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& kvs = read.responses(static_cast<int>(i)).response_range().kvs();
    KeyState& k = s.keys[keys[i]];
    if (!kvs.empty()) {
      k.value = kvs[0].value();
      k.mod_revision = kvs[0].mod_revision();
    }
  }
  const pb::RangeResponse& usage = read.responses(static_cast<int>(keys.size())).response_range();
  for (const auto& kv : usage.kvs()) {
    const Usage u = ParseUsage(kv.value());
    s.uid += u;
    if (JobOfUsageKey(ns.first, kv.key()) == ns.second) s.job += u;
    if (kv.key() == UsageKey(ns)) {
      s.node = u;
      s.node_usage_revision = kv.mod_revision();
    }
  }
  return s;
}

void ClusterStore::ComputeWrites(const store::Namespace& ns, BatchState& s,
                                 std::vector<Write>& batch) const {
  for (Write& w : batch) {
    KeyState& k = s.keys[w.key];
    const std::string* current = k.value.has_value() ? &*k.value : nullptr;
    w.result = w.compute(current);
    if (!w.result.ok() || w.result->kind == Change::kKeep) continue;
    Change& change = *w.result;
    change.existed = current != nullptr;
    Usage delta;
    const int64_t old_bytes = current == nullptr ? 0 : w.key.size() + current->size();
    if (change.kind == Change::kPut) {
      if (absl::Status st = store::CheckStoreValue(limits_, change.value); !st.ok()) {
        w.result = st;
        continue;
      }
      delta.keys = current == nullptr ? 1 : 0;
      delta.bytes = static_cast<int64_t>(w.key.size() + change.value.size()) - old_bytes;
    } else {
      delta.keys = current == nullptr ? 0 : -1;
      delta.bytes = -old_bytes;
    }
    if (absl::Status st = CheckLimits(ns, s.job + s.added, s.uid + s.added, delta); !st.ok()) {
      w.result = st;
      continue;
    }
    s.added += delta;
    k.changed = true;
    if (change.kind == Change::kPut) {
      k.value = change.value;
    } else {
      k.value.reset();
    }
  }
}

void ClusterStore::Apply(const store::Namespace& ns, const std::vector<std::string>& keys,
                         const pb::TxnResponse& read, std::vector<Write> batch, int attempt,
                         absl::Time deadline) {
  BatchState s = ReadBatch(ns, keys, read);
  ComputeWrites(ns, s, batch);
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(ns);
    lease = it == jobs_.end() ? 0 : it->second.lease;
  }
  // Written only if no key it changes moved since the read (their other writers: the job's
  // ranks on other nodes) and this node's usage key did not either. Other nodes' usage is not
  // compared: the limits may be overshot by what other nodes commit at the same time
  // (docs/cluster.md, "Limits"), and no writer of the uid waits for another's.
  pb::TxnRequest txn;
  for (const auto& [key, k] : s.keys) {
    if (!k.changed) continue;
    pb::Compare* unmoved = txn.add_compare();
    unmoved->set_key(StoreKey(ns, key));
    unmoved->set_target(pb::Compare::MOD);
    unmoved->set_result(pb::Compare::EQUAL);
    unmoved->set_mod_revision(k.mod_revision);  // 0 matches an absent key
    if (k.value.has_value()) {
      pb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(StoreKey(ns, key));
      put->set_value(*k.value);
      put->set_lease(lease);
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key(StoreKey(ns, key));
    }
  }
  if (txn.success_size() == 0) return FinishBatch(ns, std::move(batch), absl::OkStatus());
  pb::Compare* own = txn.add_compare();
  own->set_key(UsageKey(ns));
  own->set_target(pb::Compare::MOD);
  own->set_result(pb::Compare::EQUAL);
  own->set_mod_revision(s.node_usage_revision);
  pb::PutRequest* put_usage = txn.add_success()->mutable_request_put();
  put_usage->set_key(UsageKey(ns));
  put_usage->set_value(absl::StrCat(s.node.keys + s.added.keys, " ", s.node.bytes + s.added.bytes));
  put_usage->set_lease(lease);
  cluster_->etcd().Txn(txn, [this, ns, lease, batch = std::move(batch), attempt,
                             deadline](absl::StatusOr<pb::TxnResponse> r) mutable {
    if (r.ok() && r->succeeded()) return FinishBatch(ns, std::move(batch), absl::OkStatus());
    if (!r.ok() && !IsLeaseGone(r.status())) return FinishBatch(ns, std::move(batch), r.status());
    if (absl::Now() >= deadline) {
      const std::string key = batch.front().key;
      return FinishBatch(
          ns, std::move(batch),
          absl::AbortedError(absl::StrCat("store key ", QuoteForError(key), " of job '", ns.second,
                                          "': other nodes wrote the same key(s) first for ",
                                          absl::FormatDuration(kContentionLimit), " (", attempt + 1,
                                          " tries); retry")));
    }
    if (!r.ok()) LeaseLost(ns, lease);  // the job's lease expired under us: a new one first
    // Another node wrote one of the keys first: read again after a jittered pause, so that the
    // nodes contending for a key do not meet again in the same instant.
    timers_->Schedule(absl::Now() + Backoff(attempt),
                      [this, ns, batch = std::move(batch), attempt, deadline]() mutable {
                        EnsureLease(ns, [this, ns, batch = std::move(batch), attempt,
                                         deadline](absl::StatusOr<int64_t> l) mutable {
                          if (!l.ok()) return FinishBatch(ns, std::move(batch), l.status());
                          CommitBatch(ns, std::move(batch), attempt + 1, deadline);
                        });
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
          const size_t bytes = value.size();
          Mutate(
              ns, key, bytes,
              [value = std::move(value)](const std::string*) -> absl::StatusOr<Change> {
                return Change{.kind = Change::kPut, .value = value};
              },
              [done = std::move(done)](absl::StatusOr<Change> c) {
                if (!c.ok()) return done(c.status());
                done(true);
              });
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
        ns, key, /*bytes=*/20,  // the sum in decimal
        [key, delta](const std::string* current) -> absl::StatusOr<Change> {
          ASSIGN_OR_RETURN(int64_t sum, store::AddToStoreValue(key, current, delta));
          return Change{.kind = Change::kPut, .value = absl::StrCat(sum)};
        },
        [done = std::move(done)](absl::StatusOr<Change> c) {
          if (!c.ok()) return done(c.status());
          int64_t sum = 0;
          (void)absl::SimpleAtoi(c->value, &sum);
          done(sum);
        });
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
              ns, key, desired.size(),
              [expected, desired](const std::string* current) -> absl::StatusOr<Change> {
                const bool matches = current == nullptr ? expected.empty() : *current == expected;
                if (!matches) return Change{.reply = current == nullptr ? "" : *current};
                return Change{.kind = Change::kPut, .value = desired, .reply = desired};
              },
              [done = std::move(done)](absl::StatusOr<Change> c) {
                if (!c.ok()) return done(c.status());
                done(c->reply);
              });
        });
}

void ClusterStore::Delete(const server::Session& s, const std::string& key, Done<bool> done) {
  const store::Namespace ns{s.uid, s.job_id};
  Begin(s, key, [this, ns, key, done = std::move(done)](absl::StatusOr<int64_t> l) mutable {
    if (!l.ok()) return done(l.status());
    Mutate(
        ns, key, /*bytes=*/0,
        [](const std::string* current) -> absl::StatusOr<Change> {
          if (current == nullptr) return Change{};
          return Change{.kind = Change::kDelete};
        },
        [done = std::move(done)](absl::StatusOr<Change> c) {
          if (!c.ok()) return done(c.status());
          done(c->existed);
        });
  });
}

}  // namespace commd::cluster
