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

grpc::ServerUnaryReactor* NodeService::ListClusterNodes(grpc::CallbackServerContext* ctx,
                                                        const v1::ListClusterNodesRequest* request,
                                                        v1::ListClusterNodesResponse* response) {
  // From the daemon's view in memory, at most NodeView::kMaxAnswer nodes: a call costs etcd
  // nothing and its answer is bounded, whoever asks and how often.
  return rpc_->Serve(ctx, "ListClusterNodes", [&](const Session&) -> absl::Status {
    absl::StatusOr<v1::ListClusterNodesResponse> page = list_nodes_(*request);
    if (!page.ok()) return page.status();
    *response = *std::move(page);
    return absl::OkStatus();
  });
}

}  // namespace commd::server
