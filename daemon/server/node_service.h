// gRPC Node service: daemon status and node topology (proto/commd/v1/node.proto).
#ifndef COMMD_DAEMON_SERVER_NODE_SERVICE_H_
#define COMMD_DAEMON_SERVER_NODE_SERVICE_H_

#include <functional>

#include "commd/v1/node.grpc.pb.h"
#include "daemon/server/rpc.h"

namespace commd::server {

class NodeService final : public v1::Node::CallbackService {
 public:
  // `status` fills the live fields of NodeStatus; `topology` is what discovery found.
  NodeService(RpcContext* rpc, std::function<void(v1::NodeStatus*)> status,
              std::function<v1::Topology()> topology)
      : rpc_(rpc), status_(std::move(status)), topology_(std::move(topology)) {}

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* request,
                                      v1::NodeStatus* response) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* ctx,
                                        const v1::GetTopologyRequest* request,
                                        v1::Topology* response) override;

 private:
  RpcContext* const rpc_;
  const std::function<void(v1::NodeStatus*)> status_;
  const std::function<v1::Topology()> topology_;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_NODE_SERVICE_H_
