// gRPC Store service (proto/commd/v1/store.proto) over KvStore; the caller's session names the
// namespace, so a job only ever sees its own keys.
#ifndef COMMD_DAEMON_STORE_STORE_SERVICE_H_
#define COMMD_DAEMON_STORE_STORE_SERVICE_H_

#include "absl/synchronization/mutex.h"
#include "commd/v1/store.grpc.pb.h"
#include "daemon/server/rpc.h"
#include "daemon/store/kv_store.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::store {

class StoreService final : public v1::Store::CallbackService {
 public:
  StoreService(server::RpcContext* rpc, KvStore* store, prometheus::Registry* registry);

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const v1::CompareSetRequest* request,
                                       v1::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;

 private:
  // Sets the gauges from the store after each change. Reading and setting under one mutex
  // keeps a slower caller from overwriting newer figures with older ones.
  void UpdateGauges() ABSL_LOCKS_EXCLUDED(gauges_mu_);

  server::RpcContext* const rpc_;
  KvStore* const store_;
  prometheus::Gauge* keys_;
  prometheus::Gauge* waiters_;
  prometheus::Gauge* bytes_;
  absl::Mutex gauges_mu_;
};

}  // namespace commd::store

#endif  // COMMD_DAEMON_STORE_STORE_SERVICE_H_
