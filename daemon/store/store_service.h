// gRPC Store service (proto/commd/v1/store.proto), written once over a StoreBackend
// (store_backend.h): the node's own store (NodeStore) or the cluster's (cluster::ClusterStore),
// whichever the daemon serves, so a job's Client::store() means the same either way. Handlers
// only translate: every call is answered from its backend's `done`, at once or later, and
// holds no thread meanwhile.
//
//   StoreService service(rpc, &backend);
//   builder.RegisterService(&service);
#ifndef COMMD_DAEMON_STORE_STORE_SERVICE_H_
#define COMMD_DAEMON_STORE_STORE_SERVICE_H_

#include "commd/v1/store.grpc.pb.h"
#include "daemon/server/rpc.h"
#include "daemon/store/store_backend.h"

namespace commd::store {

class StoreService final : public v1::Store::CallbackService {
 public:
  // `rpc` and `store` must outlive the service.
  StoreService(server::RpcContext* rpc, StoreBackend* store) : rpc_(rpc), store_(store) {}

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
  server::RpcContext* const rpc_;
  StoreBackend* const store_;
};

}  // namespace commd::store

#endif  // COMMD_DAEMON_STORE_STORE_SERVICE_H_
