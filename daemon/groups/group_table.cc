#include "daemon/groups/group_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace commd::groups {

GroupSnapshot SnapshotOf(const Group& g) {
  GroupSnapshot s;
  s.id = g.id;
  s.uid = g.uid();
  s.job_id = g.job();
  s.name = g.name();
  s.world_size = g.world_size;
  s.joined = g.joined;
  s.active = g.active;
  s.created = g.created;
  s.timeout = g.timeout;
  s.policy = g.policy;
  s.description = g.description;
  s.global_world_size = g.global_world_size;
  s.layout = g.layout;
  for (int r = 0; r < g.world_size; ++r) {
    const Member& m = g.members[r];
    MemberSnapshot ms;
    ms.rank = r;
    ms.global_rank = m.global_rank;
    ms.joined = m.joined;
    if (m.session != nullptr) {
      ms.pid = m.session->pid;
      ms.session_token = m.session->token;
    }
    if (m.joined) ms.device = m.device.ToString();
    ms.gone = m.gone;
    ms.died = m.died;
    ms.block = m.control_map;
    if (m.joined && m.control_block) s.memory_bytes += m.control_block->block.bytes;
    s.members.push_back(std::move(ms));
  }
  for (const auto& [id, a] : g.allocations) {
    for (const auto& b : a.buffers) s.memory_bytes += b->block.bytes;
  }
  return s;
}

GroupTable::GroupTable(GroupTableLimits limits) : limits_(limits) {}

absl::StatusOr<std::shared_ptr<Group>> GroupTable::FindOrCreate(const server::Session& session,
                                                                const v1::JoinGroupRequest& request,
                                                                absl::Duration timeout,
                                                                bool* created) {
  *created = false;
  const GroupKey key{session.uid, session.job_id, request.name()};
  if (auto it = by_name_.find(key); it != by_name_.end()) return groups_.at(it->second);
  if (by_name_.size() >= limits_.max_groups) {
    return absl::ResourceExhaustedError(
        absl::StrCat("group limit reached: ", by_name_.size(), " groups (limits.max_groups)"));
  }
  // Each uid's share of the rendezvous slots, so that one user's never-completed groups
  // cannot fill max_groups for everyone.
  if (forming_.of(session.uid) >= limits_.max_groups_forming_per_uid) {
    return UidShareExhausted(session.uid, forming_.of(session.uid),
                             limits_.max_groups_forming_per_uid, "groups in rendezvous",
                             "groups_forming");
  }
  forming_.Add(session.uid, 1);
  auto group = std::make_shared<Group>();
  group->id = next_id_++;
  group->key = key;
  group->world_size = request.world_size();
  group->members.resize(request.world_size());
  group->asks_made.resize(request.world_size());
  group->created = absl::Now();
  group->timeout = timeout;
  group->policy = request.watchdog_policy();
  group->description = DescriptionOf(request);
  // 0 for a group on this node only, however the request said so (0 or world_size).
  group->global_world_size =
      request.global_world_size() > request.world_size() ? request.global_world_size() : 0;
  groups_[group->id] = group;
  by_name_[key] = group->id;
  *created = true;
  return group;
}

std::shared_ptr<Group> GroupTable::Find(uint64_t id) const {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : it->second;
}

Group* GroupTable::FindForMember(const server::Session& session, uint64_t id, int* rank) const {
  auto it = groups_.find(id);
  if (it == groups_.end() || it->second->retired) return nullptr;
  Group& g = *it->second;
  for (int r = 0; r < g.world_size; ++r) {
    const Member& m = g.members[r];
    if (m.joined && !m.gone && m.session->token == session.token) {
      *rank = r;
      return &g;
    }
  }
  return nullptr;
}

void GroupTable::Formed(const Group& group) { forming_.Sub(group.uid(), 1); }

void GroupTable::Remove(const Group& group) {
  if (!group.active) forming_.Sub(group.uid(), 1);  // only forming groups hold a share
  by_name_.erase(group.key);
  groups_.erase(group.id);
}

std::vector<std::shared_ptr<Group>> GroupTable::All() const {
  std::vector<std::shared_ptr<Group>> out;
  out.reserve(groups_.size());
  for (const auto& [id, g] : groups_) out.push_back(g);
  return out;
}

void GroupTable::Publish() {
  auto next = std::make_shared<GroupsSnapshot>();
  next->groups.reserve(groups_.size());
  for (const auto& [id, g] : groups_) next->groups.push_back(SnapshotOf(*g));
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_ = std::move(next);
}

std::shared_ptr<const GroupsSnapshot> GroupTable::Snapshot() const {
  absl::MutexLock lock(&snapshot_mu_);
  return snapshot_;
}

}  // namespace commd::groups
