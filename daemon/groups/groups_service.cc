#include "daemon/groups/groups_service.h"

namespace commd::groups {

grpc::ServerUnaryReactor* GroupsService::JoinGroup(grpc::CallbackServerContext* ctx,
                                                   const v1::JoinGroupRequest* request,
                                                   v1::JoinGroupResponse* response) {
  return rpc_->ServeLater(ctx, "JoinGroup", [&](auto session, auto call) {
    registry_->Join(std::move(session), *request, response, std::move(call));
  });
}

grpc::ServerUnaryReactor* GroupsService::AllocateSymmetric(
    grpc::CallbackServerContext* ctx, const v1::AllocateSymmetricRequest* request,
    v1::SymmetricAllocation* response) {
  return rpc_->ServeLater(ctx, "AllocateSymmetric", [&](auto session, auto call) {
    registry_->AllocateSymmetric(std::move(session), *request, response, std::move(call));
  });
}

grpc::ServerUnaryReactor* GroupsService::ReleaseSymmetric(
    grpc::CallbackServerContext* ctx, const v1::ReleaseSymmetricRequest* request,
    v1::ReleaseSymmetricResponse* response) {
  return rpc_->Serve(ctx, "ReleaseSymmetric", [&](const server::Session& session) {
    return registry_->ReleaseSymmetric(session, *request);
  });
}

grpc::ServerUnaryReactor* GroupsService::ListGroups(grpc::CallbackServerContext* ctx,
                                                    const v1::ListGroupsRequest* request,
                                                    v1::ListGroupsResponse* response) {
  return rpc_->Serve(ctx, "ListGroups", [&](const server::Session& session) {
    for (auto& g : registry_->List(session)) *response->add_groups() = std::move(g);
    return absl::OkStatus();
  });
}

}  // namespace commd::groups
