// gRPC Store service (proto/commd/v1/store.proto) over the cluster's store: the daemon
// registers it instead of store::StoreService when a cluster is configured, so a job's
// Client::store() is the same on every node. Handlers only translate; every call is answered
// later, from the etcd call that completes it.
#ifndef COMMD_DAEMON_CLUSTER_CLUSTER_STORE_SERVICE_H_
#define COMMD_DAEMON_CLUSTER_CLUSTER_STORE_SERVICE_H_

#include "commd/v1/store.grpc.pb.h"
#include "daemon/cluster/cluster_store.h"
#include "daemon/server/rpc.h"

namespace commd::cluster {

class ClusterStoreService final : public v1::Store::CallbackService {
 public:
  ClusterStoreService(server::RpcContext* rpc, ClusterStore* store) : rpc_(rpc), store_(store) {}

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
  ClusterStore* const store_;
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_CLUSTER_STORE_SERVICE_H_
