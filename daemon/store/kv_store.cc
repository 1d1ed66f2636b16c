#include "daemon/store/kv_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace commd::store {
namespace {

constexpr size_t kMaxWaitKeys = 1024;

}  // namespace

KvStore::KvStore(StoreLimits limits, server::TimerQueue* timers)
    : limits_(limits), timers_(timers) {}

absl::Status KvStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > limits_.max_key_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store key of ", key.size(),
                                                     " bytes exceeds limits.max_store_key_bytes ",
                                                     limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status KvStore::Put(const Namespace& ns, const std::string& key, std::string value,
                          std::vector<std::function<void()>>* completed) {
  if (value.size() > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("store value of ", value.size(),
                                                     " bytes exceeds limits.max_store_value_bytes ",
                                                     limits_.max_value_bytes));
  }
  auto& map = data_[ns];
  auto it = map.find(key);
  if (it != map.end()) {
    it->second = std::move(value);
    return absl::OkStatus();
  }
  if (map.size() >= limits_.max_keys_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", ns.second, " holds ", map.size(),
                                                     " store keys, the limit "
                                                     "(limits.max_store_keys_per_job)"));
  }
  map.emplace(key, std::move(value));
  ++keys_;
  // A new key may complete waiters of this namespace.
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (w->second.ns == ns && w->second.missing.erase(key) > 0 && w->second.missing.empty()) {
      timers_->Cancel(w->second.timer);
      completed->push_back([done = std::move(w->second.done)] { done(absl::OkStatus()); });
      w = waiters_.erase(w);
    } else {
      ++w;
    }
  }
  return absl::OkStatus();
}

absl::Status KvStore::Set(const Namespace& ns, const std::string& key, std::string value) {
  RETURN_IF_ERROR(CheckKey(key));
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
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto map = data_.find(ns);
  if (map != data_.end()) {
    if (auto it = map->second.find(key); it != map->second.end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat("no store key '", key, "' in job ", ns.second));
}

absl::StatusOr<int64_t> KvStore::Add(const Namespace& ns, const std::string& key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key));
  std::vector<std::function<void()>> completed;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    auto map = data_.find(ns);
    int64_t current = 0;
    if (map != data_.end()) {
      if (auto it = map->second.find(key); it != map->second.end()) {
        if (!absl::SimpleAtoi(it->second, &current)) {
          return absl::FailedPreconditionError(
              absl::StrCat("store key '", key, "' holds a value that is not a decimal integer"));
        }
      }
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::OutOfRangeError(
          absl::StrCat("adding ", delta, " to ", current, " under '", key, "' overflows int64"));
    }
    RETURN_IF_ERROR(Put(ns, key, absl::StrCat(sum), &completed));
  }
  for (auto& f : completed) f();
  return sum;
}

absl::StatusOr<std::string> KvStore::CompareSet(const Namespace& ns, const std::string& key,
                                                const std::string& expected, std::string desired) {
  RETURN_IF_ERROR(CheckKey(key));
  std::vector<std::function<void()>> completed;
  std::string now;
  {
    absl::MutexLock lock(&mu_);
    auto& map = data_[ns];
    auto it = map.find(key);
    const bool matches = it == map.end() ? expected.empty() : it->second == expected;
    if (!matches) return it == map.end() ? std::string() : it->second;
    now = desired;
    RETURN_IF_ERROR(Put(ns, key, std::move(desired), &completed));
  }
  for (auto& f : completed) f();
  return now;
}

absl::StatusOr<bool> KvStore::Delete(const Namespace& ns, const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto map = data_.find(ns);
  if (map == data_.end() || map->second.erase(key) == 0) return false;
  --keys_;
  if (map->second.empty()) data_.erase(map);
  return true;
}

absl::StatusOr<WaitId> KvStore::Wait(const Namespace& ns, const std::vector<std::string>& keys,
                                     absl::Duration timeout,
                                     std::function<void(absl::Status)> done) {
  if (keys.empty() || keys.size() > kMaxWaitKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait for ", keys.size(), " keys; allowed 1 to ", kMaxWaitKeys));
  }
  for (const std::string& key : keys) RETURN_IF_ERROR(CheckKey(key));
  if (timeout < absl::ZeroDuration() || timeout > limits_.max_wait) {
    return absl::InvalidArgumentError(absl::StrCat("wait timeout ", absl::FormatDuration(timeout),
                                                   "; allowed 0 to ",
                                                   absl::FormatDuration(limits_.max_wait)));
  }
  Waiter waiter;
  waiter.ns = ns;
  waiter.done = std::move(done);
  WaitId id;
  {
    absl::MutexLock lock(&mu_);
    auto map = data_.find(ns);
    for (const std::string& key : keys) {
      if (map == data_.end() || !map->second.contains(key)) waiter.missing.insert(key);
    }
    id = next_wait_++;
    if (!waiter.missing.empty()) {
      waiter.timer = timers_->Schedule(absl::Now() + timeout, [this, id] { OnTimeout(id); });
      waiters_.emplace(id, std::move(waiter));
      return id;
    }
  }
  waiter.done(absl::OkStatus());  // everything was there already
  return id;
}

void KvStore::OnTimeout(WaitId id) {
  Waiter waiter;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    waiter = std::move(it->second);
    waiters_.erase(it);
  }
  waiter.done(absl::DeadlineExceededError(
      absl::StrCat("store keys still missing: ", absl::StrJoin(waiter.missing, ", "))));
}

void KvStore::CancelWait(WaitId id) {
  absl::MutexLock lock(&mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  timers_->Cancel(it->second.timer);
  waiters_.erase(it);
}

size_t KvStore::key_count() const {
  absl::MutexLock lock(&mu_);
  return keys_;
}

size_t KvStore::waiter_count() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace commd::store
