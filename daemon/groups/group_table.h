// The group table: every group forming or active, by id and by (uid, job, name), the limits on
// how many there may be, and the published snapshot of them all.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<Group> g, table.Create(session, request, timeout, s));
//   ...                      // change groups under the caller's lock, then
//   table.Publish();         // readers see the change from the next Snapshot()
//
// Not thread-safe except Snapshot(): the registry's lock guards every other call.
#ifndef COMMD_DAEMON_GROUPS_GROUP_TABLE_H_
#define COMMD_DAEMON_GROUPS_GROUP_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/groups.pb.h"
#include "common/uid_share.h"
#include "daemon/groups/group_snapshot.h"
#include "daemon/groups/group_state.h"
#include "daemon/server/sessions.h"

namespace commd::groups {

struct GroupTableLimits {
  uint32_t max_groups = 1024;                 // limits.max_groups
  uint32_t max_groups_forming_per_uid = 256;  // limits.per_uid.groups_forming
};

class GroupTable {
 public:
  explicit GroupTable(GroupTableLimits limits);

  // The session's job's group of that name, made (in rendezvous, sized by the request; then
  // `*created` is set) if there is none; RESOURCE_EXHAUSTED when a limit is reached.
  absl::StatusOr<std::shared_ptr<Group>> FindOrCreate(const server::Session& session,
                                                      const v1::JoinGroupRequest& request,
                                                      absl::Duration timeout, bool* created);
  std::shared_ptr<Group> Find(uint64_t id) const;
  // The live (not retired) group `id` in which `session` holds a rank that has not left.
  Group* FindForMember(const server::Session& session, uint64_t id, int* rank) const;

  // The group formed: it no longer counts against its uid's rendezvous share.
  void Formed(const Group& group);
  // Drops the group (its rendezvous failed, or every member left); the name is free at once.
  void Remove(const Group& group);

  // Every group, by id (a copy: callers may remove groups while walking it).
  std::vector<std::shared_ptr<Group>> All() const;
  size_t size() const { return by_name_.size(); }

  // Replaces the published snapshot with the groups as they are now.
  void Publish();
  std::shared_ptr<const GroupsSnapshot> Snapshot() const;

 private:
  const GroupTableLimits limits_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Group>> groups_;
  std::map<GroupKey, uint64_t> by_name_;
  UidTally forming_;  // groups in rendezvous, per uid

  mutable absl::Mutex snapshot_mu_;
  std::shared_ptr<const GroupsSnapshot> snapshot_ ABSL_GUARDED_BY(snapshot_mu_) =
      std::make_shared<const GroupsSnapshot>();
};

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_GROUP_TABLE_H_
