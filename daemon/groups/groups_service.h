// gRPC Groups service (proto/commd/v1/groups.proto) over the GroupRegistry.
#ifndef COMMD_DAEMON_GROUPS_GROUPS_SERVICE_H_
#define COMMD_DAEMON_GROUPS_GROUPS_SERVICE_H_

#include "commd/v1/groups.grpc.pb.h"
#include "daemon/groups/group_registry.h"
#include "daemon/server/rpc.h"

namespace commd::groups {

class GroupsService final : public v1::Groups::CallbackService {
 public:
  GroupsService(server::RpcContext* rpc, GroupRegistry* registry)
      : rpc_(rpc), registry_(registry) {}

  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* ctx,
                                      const v1::JoinGroupRequest* request,
                                      v1::JoinGroupResponse* response) override;
  grpc::ServerUnaryReactor* AllocateSymmetric(grpc::CallbackServerContext* ctx,
                                              const v1::AllocateSymmetricRequest* request,
                                              v1::SymmetricAllocation* response) override;
  grpc::ServerUnaryReactor* ReleaseSymmetric(grpc::CallbackServerContext* ctx,
                                             const v1::ReleaseSymmetricRequest* request,
                                             v1::ReleaseSymmetricResponse* response) override;
  grpc::ServerUnaryReactor* ListGroups(grpc::CallbackServerContext* ctx,
                                       const v1::ListGroupsRequest* request,
                                       v1::ListGroupsResponse* response) override;

 private:
  server::RpcContext* const rpc_;
  GroupRegistry* const registry_;
};

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_GROUPS_SERVICE_H_
