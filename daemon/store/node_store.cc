#include "daemon/store/node_store.h"

#include <utility>

namespace commd::store {
namespace {

Namespace Of(const server::Session& s) { return {s.uid, s.job_id}; }

}  // namespace

NodeStore::NodeStore(KvStore* store, prometheus::Registry* registry) : store_(store) {
  keys_ = &prometheus::BuildGauge()
               .Name("commd_store_keys")
               .Help("Keys held in the per-job stores")
               .Register(*registry)
               .Add({});
  waiters_ = &prometheus::BuildGauge()
                  .Name("commd_store_waiters")
                  .Help("Store Wait calls waiting for keys")
                  .Register(*registry)
                  .Add({});
  bytes_ = &prometheus::BuildGauge()
                .Name("commd_store_bytes")
                .Help(
                    "Bytes the per-job stores hold (keys, values, pending waits' keys), as "
                    "counted against limits.max_store_bytes")
                .Register(*registry)
                .Add({});
}

void NodeStore::UpdateGauges() {
  absl::MutexLock lock(&gauges_mu_);
  keys_->Set(static_cast<double>(store_->key_count()));
  waiters_->Set(static_cast<double>(store_->waiter_count()));
  bytes_->Set(static_cast<double>(store_->byte_count()));
}

void NodeStore::Set(const server::Session& s, const std::string& key, std::string value,
                    Done<bool> done) {
  const absl::Status status = store_->Set(Of(s), key, std::move(value));
  if (!status.ok()) return done(status);
  UpdateGauges();
  done(true);
}

void NodeStore::Get(const server::Session& s, const std::string& key, Done<std::string> done) {
  done(store_->Get(Of(s), key));
}

void NodeStore::Add(const server::Session& s, const std::string& key, int64_t delta,
                    Done<int64_t> done) {
  absl::StatusOr<int64_t> value = store_->Add(Of(s), key, delta);
  if (value.ok()) UpdateGauges();
  done(std::move(value));
}

void NodeStore::CompareSet(const server::Session& s, const std::string& key, std::string expected,
                           std::string desired, Done<std::string> done) {
  absl::StatusOr<std::string> value = store_->CompareSet(Of(s), key, expected, std::move(desired));
  if (value.ok()) UpdateGauges();
  done(std::move(value));
}

void NodeStore::Delete(const server::Session& s, const std::string& key, Done<bool> done) {
  absl::StatusOr<bool> existed = store_->Delete(Of(s), key);
  if (existed.ok()) UpdateGauges();
  done(std::move(existed));
}

absl::StatusOr<WaitId> NodeStore::Wait(const server::Session& s,
                                       const std::vector<std::string>& keys, absl::Duration timeout,
                                       std::function<void(absl::Status)> done) {
  auto id = store_->Wait(Of(s), keys, timeout, [this, done = std::move(done)](absl::Status status) {
    done(std::move(status));
    UpdateGauges();
  });
  if (id.ok()) UpdateGauges();
  return id;
}

void NodeStore::CancelWait(WaitId id) {
  store_->CancelWait(id);
  UpdateGauges();
}

}  // namespace commd::store
