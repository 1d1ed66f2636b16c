#include "daemon/groups/groups_service.h"

#include <algorithm>
#include <tuple>

namespace commd::groups {

namespace {

v1::GroupInfo InfoOf(const GroupSnapshot& g) {
  v1::GroupInfo info;
  info.set_job_id(g.job_id);
  info.set_uid(g.uid);
  info.set_name(g.name);
  info.set_world_size(g.world_size);
  info.set_joined(g.joined);
  info.set_state(g.active ? "active" : "rendezvous");
  for (const MemberSnapshot& m : g.members) {
    if (!m.joined) continue;
    v1::Member* pm = info.add_members();
    pm->set_rank(m.rank);
    pm->set_global_rank(m.global_rank);
    pm->set_pid(m.pid);
    pm->set_device(m.device);
  }
  info.set_memory_bytes(g.memory_bytes);
  info.set_description(g.description);
  if (g.global_world_size > g.world_size) {
    info.set_global_world_size(g.global_world_size);
    info.set_node_count(g.layout.nodes_size());  // 0 until the nodes met
    info.set_node_index(g.layout.nodes_size() > 0 ? g.layout.this_node() : -1);
    info.set_formation(g.layout.formation());
  }
  return info;
}

}  // namespace

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
    // The caller's job's groups; every job's for an admin session.
    GroupSelector selector;
    if (!session.admin) selector.job = std::make_pair(session.uid, session.job_id);
    const std::shared_ptr<const GroupsSnapshot> now = registry_->Snapshot();
    std::vector<const GroupSnapshot*> groups = Select(*now, selector, /*active_only=*/false);
    // By (uid, job, name), as operators read them.
    std::sort(groups.begin(), groups.end(), [](const GroupSnapshot* a, const GroupSnapshot* b) {
      return std::tie(a->uid, a->job_id, a->name) < std::tie(b->uid, b->job_id, b->name);
    });
    for (const GroupSnapshot* g : groups) *response->add_groups() = InfoOf(*g);
    return absl::OkStatus();
  });
}

}  // namespace commd::groups
