#include "daemon/store/kv_store.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::store {
namespace {

constexpr size_t kMaxWaitKeys = 1024;
// Missing keys a timed-out Wait names; the rest are counted.
constexpr size_t kMaxNamedMissingKeys = 8;

// "\"a\", \"b\" and 3 more": a Wait may name 1024 keys of up to limits.max_store_key_bytes each.
std::string MissingKeys(const std::set<std::string>& keys) {
  std::vector<std::string> quoted;
  for (const std::string& key : keys) {
    if (quoted.size() == kMaxNamedMissingKeys) break;
    quoted.push_back(QuoteForError(key));
  }
  std::string out = absl::StrJoin(quoted, ", ");
  if (keys.size() > kMaxNamedMissingKeys) {
    absl::StrAppend(&out, " and ", keys.size() - kMaxNamedMissingKeys, " more");
  }
  return out;
}

}  // namespace

absl::Status CheckStoreKey(const StoreLimits& limits, const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > limits.max_key_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store key of ", key.size(),
                                                     " bytes exceeds limits.max_store_key_bytes ",
                                                     limits.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreValue(const StoreLimits& limits, const std::string& value) {
  if (value.size() > limits.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store value of ", value.size(),
                                                     " bytes exceeds limits.max_store_value_bytes ",
                                                     limits.max_value_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckStoreWait(const StoreLimits& limits, const std::vector<std::string>& keys,
                            absl::Duration timeout) {
  if (keys.empty() || keys.size() > kMaxWaitKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait for ", keys.size(), " keys; allowed 1 to ", kMaxWaitKeys));
  }
  for (const std::string& key : keys) RETURN_IF_ERROR(CheckStoreKey(limits, key));
  if (timeout < absl::ZeroDuration() || timeout > limits.max_wait) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait timeout ", absl::FormatDuration(timeout), "; allowed 0 to ",
                     absl::FormatDuration(limits.max_wait), " (groups.max_timeout_ms)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> AddToStoreValue(const std::string& key, const std::string* current,
                                        int64_t delta) {
  int64_t value = 0;
  if (current != nullptr && !absl::SimpleAtoi(*current, &value)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store key ", QuoteForError(key), " holds a value that is not a decimal integer"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to ", value, " under ",
                                              QuoteForError(key), " overflows int64"));
  }
  return sum;
}

absl::Status JobStoreKeysExhausted(const Namespace& ns, uint64_t held, uint64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat("job '", ns.second, "' holds ", held,
                                                   " store keys, at limits.max_store_keys_per_job ",
                                                   limit));
}

absl::Status JobStoreBytesExhausted(const Namespace& ns, uint64_t would_hold, uint64_t limit) {
  return absl::ResourceExhaustedError(
      absl::StrCat("store of job '", ns.second, "' would hold ", would_hold,
                   " bytes, over limits.max_store_bytes_per_job ", limit));
}

absl::Status StoreKeyNotFound(const Namespace& ns, const std::string& key) {
  return absl::NotFoundError(
      absl::StrCat("no store key ", QuoteForError(key), " in job '", ns.second, "'"));
}

absl::Status StoreWaitTimedOut(const std::set<std::string>& missing) {
  return absl::DeadlineExceededError(
      absl::StrCat("store keys still missing: ", MissingKeys(missing)));
}

KvStore::KvStore(StoreLimits limits, server::TimerQueue* timers)
    : limits_(limits), timers_(timers) {}

absl::Status KvStore::Charge(const Namespace& ns, Job& job, uint64_t bytes) {
  if (job.bytes + bytes > limits_.max_bytes_per_job) {
    return JobStoreBytesExhausted(ns, job.bytes + bytes, limits_.max_bytes_per_job);
  }
  if (const uint64_t held = uid_bytes_.of(ns.first); held + bytes > limits_.max_bytes_per_uid) {
    return UidShareExhausted(ns.first, absl::StrCat(held), absl::StrCat(limits_.max_bytes_per_uid),
                             "bytes of store", "store_bytes", absl::StrCat(bytes));
  }
  if (bytes_ + bytes > limits_.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the stores of all jobs would hold ", bytes_ + bytes,
                     " bytes, over limits.max_store_bytes ", limits_.max_bytes));
  }
  job.bytes += bytes;
  bytes_ += bytes;
  uid_bytes_.Add(ns.first, bytes);
  return absl::OkStatus();
}

void KvStore::Release(const Namespace& ns, uint64_t bytes) {
  auto it = jobs_.find(ns);
  if (it == jobs_.end()) return;
  it->second.bytes -= bytes;
  bytes_ -= bytes;
  uid_bytes_.Sub(ns.first, bytes);
  if (it->second.keys.empty() && it->second.bytes == 0) jobs_.erase(it);
}

absl::Status KvStore::Put(const Namespace& ns, const std::string& key, std::string value,
                          std::vector<std::function<void()>>* completed) {
  RETURN_IF_ERROR(CheckStoreValue(limits_, value));
  Job& job = jobs_[ns];
  auto it = job.keys.find(key);
  if (it != job.keys.end()) {
    if (value.size() > it->second.size()) {
      RETURN_IF_ERROR(Charge(ns, job, value.size() - it->second.size()));
    } else {
      Release(ns, it->second.size() - value.size());  // the job keeps its key: not erased
    }
    it->second = std::move(value);
    return absl::OkStatus();
  }
  absl::Status admitted;
  if (job.keys.size() >= limits_.max_keys_per_job) {
    admitted = JobStoreKeysExhausted(ns, job.keys.size(), limits_.max_keys_per_job);
  } else if (uid_keys_.of(ns.first) >= limits_.max_keys_per_uid) {
    admitted = UidShareExhausted(ns.first, uid_keys_.of(ns.first), limits_.max_keys_per_uid,
                                 "store keys", "store_keys");
  } else {
    admitted = Charge(ns, job, key.size() + value.size());
  }
  if (!admitted.ok()) {
    Release(ns, 0);  // drops the job if this call created it
    return admitted;
  }
  job.keys.emplace(key, std::move(value));
  ++keys_;
  uid_keys_.Add(ns.first, 1);
  // A new key may complete waiters of this namespace.
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (w->second.ns == ns && w->second.missing.erase(key) > 0 && w->second.missing.empty()) {
      timers_->Cancel(w->second.timer);
      Release(ns, w->second.charged);
      completed->push_back([done = std::move(w->second.done)] { done(absl::OkStatus()); });
      w = waiters_.erase(w);
    } else {
      ++w;
    }
  }
  return absl::OkStatus();
}

absl::Status KvStore::Set(const Namespace& ns, const std::string& key, std::string value) {
  RETURN_IF_ERROR(CheckStoreKey(limits_, key));
  std::vector<std::function<void()>> completed;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = Put(ns, key, std::move(value), &completed);
  }
  for (auto& f : completed) f();
  return status;
}

absl::StatusOr<std::string> KvStore::Get(const Namespace& ns, const std::string& key) const {
  RETURN_IF_ERROR(CheckStoreKey(limits_, key));
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(ns);
  if (job != jobs_.end()) {
    if (auto it = job->second.keys.find(key); it != job->second.keys.end()) return it->second;
  }
  return StoreKeyNotFound(ns, key);
}

absl::StatusOr<int64_t> KvStore::Add(const Namespace& ns, const std::string& key, int64_t delta) {
  RETURN_IF_ERROR(CheckStoreKey(limits_, key));
  std::vector<std::function<void()>> completed;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(ns);
    const std::string* current = nullptr;
    if (job != jobs_.end()) {
      if (auto it = job->second.keys.find(key); it != job->second.keys.end()) current = &it->second;
    }
    ASSIGN_OR_RETURN(sum, AddToStoreValue(key, current, delta));
    RETURN_IF_ERROR(Put(ns, key, absl::StrCat(sum), &completed));
  }
  for (auto& f : completed) f();
  return sum;
}

absl::StatusOr<std::string> KvStore::CompareSet(const Namespace& ns, const std::string& key,
                                                const std::string& expected, std::string desired) {
  RETURN_IF_ERROR(CheckStoreKey(limits_, key));
  std::vector<std::function<void()>> completed;
  std::string now;
  {
    absl::MutexLock lock(&mu_);
    const std::string* current = nullptr;
    if (auto job = jobs_.find(ns); job != jobs_.end()) {
      if (auto it = job->second.keys.find(key); it != job->second.keys.end()) {
        current = &it->second;
      }
    }
    const bool matches = current == nullptr ? expected.empty() : *current == expected;
    if (!matches) return current == nullptr ? std::string() : *current;
    now = desired;
    RETURN_IF_ERROR(Put(ns, key, std::move(desired), &completed));
  }
  for (auto& f : completed) f();
  return now;
}

absl::StatusOr<bool> KvStore::Delete(const Namespace& ns, const std::string& key) {
  RETURN_IF_ERROR(CheckStoreKey(limits_, key));
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(ns);
  if (job == jobs_.end()) return false;
  auto it = job->second.keys.find(key);
  if (it == job->second.keys.end()) return false;
  const uint64_t freed = it->first.size() + it->second.size();
  job->second.keys.erase(it);
  --keys_;
  uid_keys_.Sub(ns.first, 1);
  Release(ns, freed);
  return true;
}

absl::StatusOr<WaitId> KvStore::Wait(const Namespace& ns, const std::vector<std::string>& keys,
                                     absl::Duration timeout,
                                     std::function<void(absl::Status)> done) {
  if (keys.empty() || keys.size() > kMaxWaitKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait for ", keys.size(), " keys; allowed 1 to ", kMaxWaitKeys));
  }
  for (const std::string& key : keys) RETURN_IF_ERROR(CheckStoreKey(limits_, key));
  if (timeout < absl::ZeroDuration() || timeout > limits_.max_wait) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait timeout ", absl::FormatDuration(timeout), "; allowed 0 to ",
                     absl::FormatDuration(limits_.max_wait), " (groups.max_timeout_ms)"));
  }
  Waiter waiter;
  waiter.ns = ns;
  waiter.done = std::move(done);
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(ns);
    for (const std::string& key : keys) {
      if (job == jobs_.end() || !job->second.keys.contains(key)) waiter.missing.insert(key);
    }
    id = next_wait_++;
    if (!waiter.missing.empty()) {
      // A pending wait holds its keys, so it counts against the job's bytes.
      for (const std::string& key : waiter.missing) waiter.charged += key.size();
      if (absl::Status s = Charge(ns, jobs_[ns], waiter.charged); !s.ok()) {
        Release(ns, 0);  // drops the job if this call created it
        return s;
      }
      waiter.timer = timers_->Schedule(absl::Now() + timeout, [this, id] { OnTimeout(id); });
      waiters_.emplace(id, std::move(waiter));
      return id;
    }
  }
  waiter.done(absl::OkStatus());  // everything was there already
  return id;
}

std::optional<KvStore::Waiter> KvStore::TakeWaiter(WaitId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return std::nullopt;
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  Release(waiter.ns, waiter.charged);
  return waiter;
}

void KvStore::OnTimeout(WaitId id) {
  std::optional<Waiter> waiter;
  {
    absl::MutexLock lock(&mu_);
    waiter = TakeWaiter(id);
  }
  if (!waiter.has_value()) return;
  waiter->done(StoreWaitTimedOut(waiter->missing));
}

void KvStore::CancelWait(WaitId id) {
  std::optional<Waiter> waiter;  // declared first: its callback is destroyed after unlocking
  absl::MutexLock lock(&mu_);
  waiter = TakeWaiter(id);
  if (waiter.has_value()) timers_->Cancel(waiter->timer);
}

size_t KvStore::key_count() const {
  absl::MutexLock lock(&mu_);
  return keys_;
}

size_t KvStore::waiter_count() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

size_t KvStore::key_count(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  return uid_keys_.of(uid);
}

uint64_t KvStore::byte_count(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  return uid_bytes_.of(uid);
}

uint64_t KvStore::byte_count() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace commd::store
