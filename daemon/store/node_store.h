// NodeStore: the node's own job store as a StoreBackend (store_backend.h): KvStore's data,
// answered at once, with the store's gauges (commd_store_keys, commd_store_waiters,
// commd_store_bytes) set after every change. The daemon serves it when no cluster is
// configured.
//
//   KvStore kv(limits, &timers);
//   NodeStore node(&kv, &registry);
//   StoreService service(rpc, &node);
#ifndef COMMD_DAEMON_STORE_NODE_STORE_H_
#define COMMD_DAEMON_STORE_NODE_STORE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/kv_store.h"
#include "daemon/store/store_backend.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::store {

class NodeStore final : public StoreBackend {
 public:
  // `store` must outlive this; the gauges are registered in `registry`. Thread-safe.
  NodeStore(KvStore* store, prometheus::Registry* registry);

  void Set(const server::Session& s, const std::string& key, std::string value,
           Done<bool> done) override;
  void Get(const server::Session& s, const std::string& key, Done<std::string> done) override;
  void Add(const server::Session& s, const std::string& key, int64_t delta,
           Done<int64_t> done) override;
  void CompareSet(const server::Session& s, const std::string& key, std::string expected,
                  std::string desired, Done<std::string> done) override;
  void Delete(const server::Session& s, const std::string& key, Done<bool> done) override;
  absl::StatusOr<WaitId> Wait(const server::Session& s, const std::vector<std::string>& keys,
                              absl::Duration timeout,
                              std::function<void(absl::Status)> done) override;
  void CancelWait(WaitId id) override;

 private:
  // Sets the gauges from the store after each change. Reading and setting under one mutex
  // keeps a slower caller from overwriting newer figures with older ones.
  void UpdateGauges() ABSL_LOCKS_EXCLUDED(gauges_mu_);

  KvStore* const store_;
  prometheus::Gauge* keys_;
  prometheus::Gauge* waiters_;
  prometheus::Gauge* bytes_;
  absl::Mutex gauges_mu_;
};

}  // namespace commd::store

#endif  // COMMD_DAEMON_STORE_NODE_STORE_H_
