// Groups of ranks on this node: rendezvous, each member's control block, and symmetric
// allocations (one buffer per rank, every rank mapping every other's).
//
// Every call that waits on other ranks (Join, AllocateSymmetric) answers through a
// PendingCall, so no thread blocks while a rank is missing; deadlines come from a TimerQueue.
// Groups are namespaced by (uid, job id, name); another job's group is NOT_FOUND.
//
// What ends a wait early:
//   - a rank whose process exits while others wait for it fails them with ABORTED naming it,
//     its pid and how it ended; on_rank_death then aborts the group's collectives too;
//   - the deadline fails the waiting ranks with DEADLINE_EXCEEDED naming the ranks missing;
//   - a rank whose Join call dies without its process exiting fails them too (ABORTED).
// A departed member's memory is released after session.release_grace_ms, so a dump can still
// read its control block. Thread-safe.
#ifndef COMMD_DAEMON_GROUPS_GROUP_REGISTRY_H_
#define COMMD_DAEMON_GROUPS_GROUP_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/groups.pb.h"
#include "common/uid_share.h"
#include "daemon/memory/allocation_table.h"
#include "daemon/recorder/dumper.h"
#include "daemon/server/rpc.h"
#include "daemon/server/sessions.h"
#include "daemon/server/timer_queue.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace commd::groups {

// A group as the watchdog sees it: its members' control blocks and whether each still lives.
struct WatchedMember {
  int rank = 0;
  int global_rank = 0;
  int64_t pid = 0;
  bool gone = false;
  bool died = false;  // its process exited with the session open (not a clean close)
  std::string session_token;
  std::shared_ptr<const SharedMapping> block;  // null before the group formed
};
struct WatchedGroup {
  uint64_t id = 0;
  uid_t uid = 0;
  std::string job_id;
  std::string name;
  int world_size = 0;
  bool active = false;
  absl::Time created;
  absl::Duration timeout;
  v1::WatchdogPolicy policy = v1::WATCHDOG_POLICY_UNSPECIFIED;  // as the first rank asked
  std::vector<WatchedMember> members;                           // by rank
};

// A member's process exited while it was in a formed group: certain, unlike any hang.
struct RankDeath {
  WatchedGroup group;  // as it is now (the dead member marked died, every block still mapped)
  int rank = 0;
  // "rank 2 (pid 4711) exited: killed by SIGKILL", "rank 2 (pid 4711) exited with status 3"
  std::string text;
  std::vector<recorder::DumpSource> sources;  // every rank's block, for the one dump
};

struct GroupsOptions {
  absl::Duration default_timeout = absl::Minutes(10);
  absl::Duration max_timeout = absl::Hours(24);
  absl::Duration release_grace = absl::Seconds(30);
  uint32_t max_groups = 1024;
  uint32_t max_groups_forming_per_uid = 256;  // limits.per_uid.groups_forming
  uint32_t ring_capacity = 4096;              // flight-recorder entries per control block
  // The config's collectives settings (every field set), which a group's first rank may
  // override (nan check, sample period, policy).
  v1::CollectiveSettings collectives;
  // Called (on the thread that noticed, with no lock held) once per member whose process
  // exited while in a formed group; the watchdog aborts the group and writes the dump.
  std::function<void(const RankDeath&)> on_rank_death;
  // Called (with no lock held) when a rendezvous times out: the ranks that joined and those
  // that never did. The watchdog turns it into a diagnosis.
  std::function<void(const WatchedGroup&, std::vector<int> joined, std::vector<int> missing)>
      on_rendezvous_timeout;
};

// Which control blocks a dump wants: every job's (admin), or one job's; one group or all.
struct DumpFilter {
  std::optional<std::pair<uid_t, std::string>> job;  // (uid, job id); none: every job
  std::string group;                                 // empty: every group
};

class GroupRegistry {
 public:
  // `table`, `timers` and `registry` must outlive this object, and `timers` must be stopped
  // before it is destroyed (its callbacks call in here).
  GroupRegistry(GroupsOptions options, memory::AllocationTable* table, server::TimerQueue* timers,
                prometheus::Registry* registry);
  ~GroupRegistry();

  // Answers `call` (filling `response` first) when the group forms, or with the error.
  void Join(std::shared_ptr<const server::Session> session, const v1::JoinGroupRequest& request,
            v1::JoinGroupResponse* response, std::shared_ptr<server::PendingCall> call);
  void AllocateSymmetric(std::shared_ptr<const server::Session> session,
                         const v1::AllocateSymmetricRequest& request,
                         v1::SymmetricAllocation* response,
                         std::shared_ptr<server::PendingCall> call);
  absl::Status ReleaseSymmetric(const server::Session& session,
                                const v1::ReleaseSymmetricRequest& request);
  // The caller's job's groups; every job's for an admin session.
  std::vector<v1::GroupInfo> List(const server::Session& session) const;

  // The control blocks of formed groups that `filter` selects, kept mapped for the caller.
  std::vector<recorder::DumpSource> DumpSources(const DumpFilter& filter) const;

  // Every formed group (rendezvous ones too), for the watchdog's poll. Takes the lock briefly.
  std::vector<WatchedGroup> Watch() const;

  // A session ended: its ranks leave their groups. A "closed" session left them on purpose; a
  // process that exited with the session open died (even with status 0: its peers cannot
  // complete a collective without it).
  void OnSessionEnd(const server::Session& session, const server::SessionEnd& end);
  size_t size() const;

 private:
  struct Member;
  struct Round;
  struct SymmetricBuffers;
  struct Group;
  using Key = std::tuple<uid_t, std::string, std::string>;
  // Work done after the lock is released: answering calls, freeing memory.
  using Deferred = std::vector<std::function<void()>>;

  absl::StatusOr<std::shared_ptr<Group>> FindOrCreate(const server::Session& session,
                                                      const v1::JoinGroupRequest& request,
                                                      absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int> AddMember(Group& group, std::shared_ptr<const server::Session> session,
                                const v1::JoinGroupRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Form(Group& group, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateControlBlock(const Group& group, int rank, Member& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailRendezvous(Group& group, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnJoinTimeout(uint64_t group_id);
  void LeaveRendezvous(uint64_t group_id, int rank, const std::string& token);
  void CompleteRound(Group& group, uint64_t round, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailRound(Group& group, uint64_t round, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRoundTimeout(uint64_t group_id, uint64_t round);
  void MemberGone(Group& group, int rank, const server::SessionEnd& end, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLater(std::vector<uint64_t> allocation_ids, Deferred& deferred);
  void Retire(Group& group, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<recorder::DumpSource> SourcesOf(const Group& group) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Group* FindForMember(const server::Session& session, uint64_t group_id, int* rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WatchedGroup WatchedOf(const Group& group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupsOptions options_;
  memory::AllocationTable* const table_;
  server::TimerQueue* const timers_;
  prometheus::Gauge* groups_gauge_;
  prometheus::Histogram* rendezvous_seconds_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  // Forming or active groups by name; a retired group (every member gone) is only in groups_
  // until its memory is released, so the name can form again at once.
  std::map<Key, uint64_t> by_name_ ABSL_GUARDED_BY(mu_);
  UidTally forming_ ABSL_GUARDED_BY(mu_);  // groups in rendezvous, per uid
};

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_GROUP_REGISTRY_H_
