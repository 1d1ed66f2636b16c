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
//
// Its parts: the group table (group_table.h: the groups, their limits, the published
// snapshot), the rendezvous (rendezvous.cc), the symmetric-allocation rounds
// (symmetric_rounds.cc) and the member lifecycle (group_registry.cc).
#ifndef COMMD_DAEMON_GROUPS_GROUP_REGISTRY_H_
#define COMMD_DAEMON_GROUPS_GROUP_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/groups.pb.h"
#include "common/uid_share.h"
#include "daemon/groups/group_snapshot.h"
#include "daemon/groups/group_state.h"
#include "daemon/groups/group_table.h"
#include "daemon/groups/span_rendezvous.h"
#include "daemon/memory/allocation_table.h"
#include "daemon/server/rpc.h"
#include "daemon/server/sessions.h"
#include "daemon/server/timer_queue.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace commd::groups {

// A member's process exited while it was in a formed group: certain, unlike any hang.
struct RankDeath {
  // As it was then (the dead member marked died, every block still mapped): the group may
  // have retired by the time the hook dumps it.
  GroupSnapshot group;
  int rank = 0;
  // "rank 2 (pid 4711) exited: killed by SIGKILL", "rank 2 (pid 4711) exited with status 3"
  std::string text;
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
  std::function<void(const GroupSnapshot&, std::vector<int> joined, std::vector<int> missing)>
      on_rendezvous_timeout;
};

class GroupRegistry {
 public:
  // `memory`, `timers` and `registry` must outlive this object, and `timers` must be stopped
  // before it is destroyed (its callbacks call in here).
  GroupRegistry(GroupsOptions options, memory::AllocationTable* memory, server::TimerQueue* timers,
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
  // The group was aborted (watchdog or commctl; `why` follows "group G aborted"): a pending
  // symmetric allocation ends now with ABORTED, and so does every later one, instead of
  // waiting for the group's timeout. Collectives learn it from the control blocks.
  void Abort(uint64_t group_id, const std::string& why);
  // Every group forming or active, as of the last change: what the watchdog polls, dumps
  // read, health and listing show. Never waits on a rendezvous or an allocation.
  std::shared_ptr<const GroupsSnapshot> Snapshot() const { return table_.Snapshot(); }
  // Groups that span nodes rendezvous between nodes through `span` (null: this daemon has no
  // cluster, and such joins fail FAILED_PRECONDITION). Set it before serving; it must outlive
  // the registry's groups (Shutdown it first).
  void set_span_rendezvous(SpanRendezvous* span);

  // A session ended: its ranks leave their groups. A "closed" session left them on purpose; a
  // process that exited with the session open died (even with status 0: its peers cannot
  // complete a collective without it).
  void OnSessionEnd(const server::Session& session, const server::SessionEnd& end);
  size_t size() const;

 private:
  // rendezvous.cc
  void Form(Group& group, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateControlBlock(const Group& group, int rank, Member& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailRendezvous(Group& group, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnJoinTimeout(uint64_t group_id);
  // The deadline came with some of this node's ranks missing.
  void FailLocalRendezvous(Group& group, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveRendezvous(uint64_t group_id, int rank, const std::string& token);
  // The local ranks of a spanning group are all in: publish them and wait for the nodes.
  void StartSpan(Group& group, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnSpanDone(uint64_t group_id, absl::StatusOr<v1::GroupLayout> layout);
  // symmetric_rounds.cc
  void CompleteRound(Group& group, uint64_t round, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One rank's buffer of a symmetric allocation, on the device it joined with (host memory
  // when the round asked for it).
  absl::StatusOr<std::shared_ptr<const memory::Allocation>> AllocateRankBuffer(
      const Group& group, int rank, uint64_t round, size_t bytes, bool host_memory)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailRound(Group& group, uint64_t round, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRoundTimeout(uint64_t group_id, uint64_t round);
  void CancelAsk(uint64_t group_id, uint64_t round, int rank, const std::string& name);
  // group_registry.cc: member lifecycle
  void MemberGone(Group& group, int rank, const server::SessionEnd& end, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLater(std::vector<uint64_t> allocation_ids, Deferred& deferred);
  void Retire(Group& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the snapshot and the gauge: after every change to the groups.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupsOptions options_;
  memory::AllocationTable* const memory_;
  server::TimerQueue* const timers_;
  prometheus::Gauge* groups_gauge_;
  prometheus::Histogram* rendezvous_seconds_;

  mutable absl::Mutex mu_;
  GroupTable table_;  // under mu_, except Snapshot(), which has its own lock
  SpanRendezvous* span_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_GROUP_REGISTRY_H_
