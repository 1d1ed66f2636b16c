// Group state as the rest of the daemon reads it: one immutable snapshot of every group,
// published by the registry on each membership or state change, and one selector that the
// watchdog, the dumps, health and listing use to pick groups out of it.
//
//   std::shared_ptr<const GroupsSnapshot> now = registry.Snapshot();
//   for (const GroupSnapshot& g : now->groups) if (selector.Selects(g)) ...
//
// A snapshot never changes once published, so readers hold no lock while they walk it; the
// control blocks it points to stay mapped while any snapshot (or copy of a group) holds them.
#ifndef COMMD_DAEMON_GROUPS_GROUP_SNAPSHOT_H_
#define COMMD_DAEMON_GROUPS_GROUP_SNAPSHOT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/v1/groups.pb.h"
#include "common/shm_mapping.h"
#include "daemon/server/sessions.h"

namespace commd::groups {

struct MemberSnapshot {
  int rank = 0;
  int global_rank = 0;
  bool joined = false;
  int64_t pid = 0;  // 0 before the rank joined
  std::string device;
  bool gone = false;
  bool died = false;  // its process exited with the session open (not a clean close)
  std::string session_token;
  std::shared_ptr<const SharedMapping> block;  // null before the group formed
};

struct GroupSnapshot {
  uint64_t id = 0;
  uid_t uid = 0;
  std::string job_id;
  std::string name;
  int world_size = 0;
  int joined = 0;
  bool active = false;  // formed; false during the rendezvous
  absl::Time created;
  absl::Duration timeout;
  v1::WatchdogPolicy policy = v1::WATCHDOG_POLICY_UNSPECIFIED;  // as the first rank asked
  std::string description;    // at most kMaxGroupDescriptionBytes; "undefined" when none given
  uint64_t memory_bytes = 0;  // control blocks and symmetric buffers
  std::vector<MemberSnapshot> members;  // by rank
  // A group that spans nodes: its size over every node (0 for a node-local group) and, once
  // formed, which global ranks live on which node.
  int global_world_size = 0;
  v1::GroupLayout layout;
};

// Every group forming or active, by id.
struct GroupsSnapshot {
  std::vector<GroupSnapshot> groups;
};

// Which groups a caller means: one job's (of one uid, or of any uid for an admin naming it) or
// every job's; one group by name or all.
struct GroupSelector {
  std::optional<std::pair<uid_t, std::string>> job;  // (uid, job id)
  std::optional<std::string> job_any_uid;            // an admin naming a job: any uid
  std::string group;                                 // empty: every group

  bool Selects(uid_t uid, const std::string& job_id, const std::string& name) const;
  bool Selects(const GroupSnapshot& g) const { return Selects(g.uid, g.job_id, g.name); }
};

// The groups a session may name: its own job's; any job's (or every job's) for an admin.
// Another job's groups are invisible to a user, not forbidden: NOT_FOUND.
absl::StatusOr<GroupSelector> SelectorFor(const server::Session& session, const std::string& job,
                                          bool all_jobs, const std::string& group);

// The groups `selector` picks from `snapshot`, formed ones only when `active_only`.
std::vector<const GroupSnapshot*> Select(const GroupsSnapshot& snapshot,
                                         const GroupSelector& selector, bool active_only);

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_GROUP_SNAPSHOT_H_
