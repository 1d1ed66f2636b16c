// Dumps of groups: the one place that turns "dump these groups" into dump sources (from the
// group registry's snapshot) and hands them to the Dumper. Every trigger goes through it: a
// rank's death, a watchdog finding, an operator's abort, the Dump RPC, SIGUSR1.
//
//   group_dumps.DumpGroups({.job = {{uid, job}}, .group = "g"}, "hang-stuck", diagnosis);
//
// With a cluster, a dump of one job is also announced to the job's other nodes
// (DumpPublisher), which dump their ranks of it under the same dump id (docs/cluster.md).
//
// Thread-safe (the snapshot is immutable; the Dumper is thread-safe).
#ifndef COMMD_DAEMON_RECORDER_GROUP_DUMPS_H_
#define COMMD_DAEMON_RECORDER_GROUP_DUMPS_H_

#include <sys/types.h>

#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/groups/group_registry.h"
#include "daemon/groups/group_snapshot.h"
#include "daemon/recorder/dumper.h"
#include "nlohmann/json.hpp"

namespace commd::recorder {

// Every rank of `group` whose control block exists, kept mapped for the dump.
std::vector<DumpSource> DumpSourcesOf(const groups::GroupSnapshot& group);

// A dump of one job that this node announces to the job's other nodes.
struct JobDumpNotice {
  uid_t uid = 0;
  std::string job_id;
  std::string group;  // empty: every group of the job
  std::string trigger;
  std::string dump_id;
  std::optional<nlohmann::json> diagnosis;
};

// Where GroupDumps announces a job's dumps (the cluster, daemon/cluster/job_dumps.h).
class DumpPublisher {
 public:
  virtual ~DumpPublisher() = default;
  // This node's name: the end of the ids of the dumps it announces.
  virtual std::string node_name() const = 0;
  // Announces `notice`; `done` runs once with the outcome, on any thread. Never blocks.
  virtual void Publish(JobDumpNotice notice, std::function<void(absl::Status)> done) = 0;
};

struct DumpHow {
  // Queued on the dumper's thread and charged to the group's uid (whoever noticed never waits),
  // or written now and the result returned.
  bool now = false;
  std::optional<uid_t> charge;  // now only: the uid whose dump rate it takes (none: free)
  // Written under this id and not announced (a node loss: every node derives it alike).
  std::string dump_id;
  // Written under this id once per node (the first time; ALREADY_EXISTS after), and announced
  // unless local_only: another node's announcement (with local_only), or an id every node
  // derives alike for what they all see (a finding on a group spanning them).
  std::string shared_id;
  // This node only, even when a publisher is set.
  bool local_only = false;
  // The nodes (this one too) dump only the group named here (an operator's request for one
  // group); else every group of the job, since what holds one group back is often another.
  bool announce_group_only = false;
  // The outcome of announcing it, called once if and only if the result says `announced`
  // (never when the dump fails); without it a failed announcement is logged.
  std::function<void(absl::Status)> announced;
};

class GroupDumps {
 public:
  // `groups` and `dumper` must outlive this object.
  GroupDumps(const groups::GroupRegistry* groups, Dumper* dumper)
      : groups_(groups), dumper_(dumper) {}

  // Announce dumps of one job through `publisher` from now on (it must outlive this object, or
  // be unset first with nullptr). Call before dumps can happen.
  void set_publisher(DumpPublisher* publisher) { publisher_ = publisher; }

  // Dumps the formed groups `selector` picks as they are now. NOT_FOUND ("no formed group 'g'
  // to dump") when it picks none; ALREADY_EXISTS when `how.shared_id` names a dump this node
  // has already written for the job (of the last kRememberedIds shared ids); a queued dump returns
  // a result with only its dump_id (when it has one). The dump is announced when a publisher is
  // set, the groups are of one job, and `how` neither carries another node's id nor says
  // local_only; the result's dump_id and announced say so.
  absl::StatusOr<DumpResult> DumpGroups(const groups::GroupSelector& selector,
                                        const std::string& trigger,
                                        std::optional<nlohmann::json> diagnosis, DumpHow how = {});
  // Dumps `group` as it was when taken (a rank's death: the group may have retired since).
  absl::StatusOr<DumpResult> DumpGroups(const groups::GroupSnapshot& group,
                                        const std::string& trigger,
                                        std::optional<nlohmann::json> diagnosis, DumpHow how = {});

 private:
  absl::StatusOr<DumpResult> DumpSources(std::vector<DumpSource> sources, const std::string& group,
                                         const std::string& trigger,
                                         std::optional<nlohmann::json> diagnosis, DumpHow how);

  // A fresh id for a dump announced from this node: distinct even within one millisecond.
  std::string MintDumpId(const std::string& trigger);

  const groups::GroupRegistry* const groups_;
  Dumper* const dumper_;
  DumpPublisher* publisher_ = nullptr;
  // Whether this node dumped `id` of the job already (and remembers it from now on).
  bool AlreadyDumped(uid_t uid, const std::string& job, const std::string& id);

  absl::Mutex mint_mu_;
  std::string last_minted_ ABSL_GUARDED_BY(mint_mu_);  // before any "-<n>"
  int repeats_ ABSL_GUARDED_BY(mint_mu_) = 0;
  // The last kRememberedIds shared ids dumped ("<uid>/<job>/<id>"), oldest first.
  static constexpr size_t kRememberedIds = 1024;
  std::deque<std::string> remembered_ ABSL_GUARDED_BY(mint_mu_);
};

}  // namespace commd::recorder

#endif  // COMMD_DAEMON_RECORDER_GROUP_DUMPS_H_
