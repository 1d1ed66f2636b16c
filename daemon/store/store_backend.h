// StoreBackend: the job store behind the gRPC Store service (store_service.h), the seam
// between the service and where a job's keys live: the node's own store (NodeStore,
// node_store.h) or, when a cluster is configured, the one in etcd shared by every node
// (cluster::ClusterStore). The daemon serves exactly one of them, so a job's keys are never
// split between the two.
//
//   StoreService service(rpc, &backend);   // backend: a NodeStore or a cluster::ClusterStore
//
// Every call answers through its `done`, once: at once on the calling thread (the node's
// store), or later on whichever thread completes it (an etcd call, a timer); the caller holds
// no thread meanwhile. The session names the namespace, (uid, job id), so a job only ever
// sees its own keys. Implementations are thread-safe.
#ifndef COMMD_DAEMON_STORE_STORE_BACKEND_H_
#define COMMD_DAEMON_STORE_STORE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/server/sessions.h"
#include "daemon/store/kv_store.h"

namespace commd::store {

class StoreBackend {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  virtual ~StoreBackend() = default;

  // The operations of proto/commd/v1/store.proto, with KvStore's meaning and wording. Set
  // answers true once stored; Delete whether the key existed; CompareSet the value the key
  // holds afterwards.
  virtual void Set(const server::Session& s, const std::string& key, std::string value,
                   Done<bool> done) = 0;
  virtual void Get(const server::Session& s, const std::string& key, Done<std::string> done) = 0;
  virtual void Add(const server::Session& s, const std::string& key, int64_t delta,
                   Done<int64_t> done) = 0;
  virtual void CompareSet(const server::Session& s, const std::string& key, std::string expected,
                          std::string desired, Done<std::string> done) = 0;
  virtual void Delete(const server::Session& s, const std::string& key, Done<bool> done) = 0;
  // `done` runs once (OK when every key exists, DEADLINE_EXCEEDED naming the missing ones after
  // `timeout`, or the backend's own failure), unless CancelWait comes first. Argument errors
  // are returned instead, and `done` is not called.
  virtual absl::StatusOr<WaitId> Wait(const server::Session& s,
                                      const std::vector<std::string>& keys, absl::Duration timeout,
                                      std::function<void(absl::Status)> done) = 0;
  // The waiter is dropped without a call to `done` (its caller went away).
  virtual void CancelWait(WaitId id) = 0;
};

}  // namespace commd::store

#endif  // COMMD_DAEMON_STORE_STORE_BACKEND_H_
