#include "daemon/server/node_service.h"

namespace commd::server {

grpc::ServerUnaryReactor* NodeService::GetStatus(grpc::CallbackServerContext* ctx,
                                                 const v1::GetStatusRequest* request,
                                                 v1::NodeStatus* response) {
  return rpc_->Serve(ctx, "GetStatus", [&](const Session&) {
    status_(response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* NodeService::GetTopology(grpc::CallbackServerContext* ctx,
                                                   const v1::GetTopologyRequest* request,
                                                   v1::Topology* response) {
  return rpc_->Serve(ctx, "GetTopology", [&](const Session&) {
    *response = topology_();
    return absl::OkStatus();
  });
}

}  // namespace commd::server
