// gRPC Node service: daemon status, node topology and the cluster's nodes
// (proto/commd/v1/node.proto). Any session may call it; nothing here waits.
#ifndef COMMD_DAEMON_SERVER_NODE_SERVICE_H_
#define COMMD_DAEMON_SERVER_NODE_SERVICE_H_

#include <functional>

#include "commd/v1/node.grpc.pb.h"
#include "daemon/server/rpc.h"

namespace commd::server {

class NodeService final : public v1::Node::CallbackService {
 public:
  using ListNodes = std::function<absl::StatusOr<v1::ListClusterNodesResponse>(
      const v1::ListClusterNodesRequest&)>;

  // `status` fills the live fields of NodeStatus; `topology` is what discovery found;
  // `list_nodes` answers ListClusterNodes from the daemon's view of the cluster (it must not
  // wait: it runs on the handler's thread).
  NodeService(RpcContext* rpc, std::function<void(v1::NodeStatus*)> status,
              std::function<v1::Topology()> topology, ListNodes list_nodes)
      : rpc_(rpc),
        status_(std::move(status)),
        topology_(std::move(topology)),
        list_nodes_(std::move(list_nodes)) {}

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* request,
                                      v1::NodeStatus* response) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* ctx,
                                        const v1::GetTopologyRequest* request,
                                        v1::Topology* response) override;
  grpc::ServerUnaryReactor* ListClusterNodes(grpc::CallbackServerContext* ctx,
                                             const v1::ListClusterNodesRequest* request,
                                             v1::ListClusterNodesResponse* response) override;

 private:
  RpcContext* const rpc_;
  const std::function<void(v1::NodeStatus*)> status_;
  const std::function<v1::Topology()> topology_;
  const ListNodes list_nodes_;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_NODE_SERVICE_H_
