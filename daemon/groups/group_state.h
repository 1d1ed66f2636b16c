// The registry's own state of one group (internal to daemon/groups): what the group table
// stores, the rendezvous fills and the symmetric rounds extend. Readers outside the registry
// see it only as a GroupSnapshot (group_snapshot.h). Not thread-safe: the registry's lock
// guards every Group.
#ifndef COMMD_DAEMON_GROUPS_GROUP_STATE_H_
#define COMMD_DAEMON_GROUPS_GROUP_STATE_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/include/commd/limits.h"
#include "commd/v1/groups.pb.h"
#include "common/control_block.h"
#include "common/shm_mapping.h"
#include "daemon/groups/group_snapshot.h"
#include "daemon/groups/span_rendezvous.h"
#include "daemon/memory/allocation_table.h"
#include "daemon/server/rpc.h"
#include "daemon/server/sessions.h"
#include "daemon/server/timer_queue.h"

namespace commd::groups {

// A group's description (at most kMaxGroupDescriptionBytes, commd/limits.h) fits a
// flight-recorder entry's pg_desc with its NUL.
static_assert(kMaxGroupDescriptionBytes < kRecordNameBytes);
// What a group that was given none is described as: PyTorch's own default, which
// torchfrtrace shows as is (an empty desc would print as a blank column).
inline constexpr char kDefaultGroupDescription[] = "undefined";

// INVALID_ARGUMENT unless `description` is at most kMaxGroupDescriptionBytes of printable
// ASCII; the message quotes a bounded prefix and names the limit.
absl::Status ValidateDescription(absl::string_view description);
// The request's description, or kDefaultGroupDescription when it gives none.
std::string DescriptionOf(const v1::JoinGroupRequest& request);

// (uid, job id, group name): groups are namespaced per job.
using GroupKey = std::tuple<uid_t, std::string, std::string>;
// Work done after the registry's lock is released: answering calls, freeing memory.
using Deferred = std::vector<std::function<void()>>;

struct Member {
  bool joined = false;
  bool gone = false;
  bool died = false;  // gone because its process exited
  std::shared_ptr<const server::Session> session;
  int global_rank = -1;
  memory::Device device;
  std::shared_ptr<server::PendingCall> pending;  // while the rendezvous forms
  v1::JoinGroupResponse* response = nullptr;
  std::shared_ptr<const memory::Allocation> control_block;
  // The daemon's view of the control block: dumps and the watchdog read it. Shared, so a dump
  // in progress keeps it mapped even if the member is released meanwhile.
  std::shared_ptr<SharedMapping> control_map;
};

// One AllocateSymmetric round: the n-th call of every rank.
struct Round {
  struct Ask {
    uint64_t bytes = 0;
    bool host_memory = false;  // AllocateSymmetricRequest.host_memory
    std::shared_ptr<server::PendingCall> call;
    v1::SymmetricAllocation* response = nullptr;
  };
  std::map<int, Ask> asks;  // by rank
  server::TimerId timer = 0;
  std::optional<absl::Status> failed;  // later askers of a failed round get this at once
};

struct SymmetricBuffers {
  std::vector<std::shared_ptr<const memory::Allocation>> buffers;  // by rank
  std::vector<bool> released;
};

struct Group {
  uint64_t id = 0;
  GroupKey key;
  int world_size = 0;
  bool active = false;
  bool retired = false;
  int joined = 0;
  std::vector<Member> members;
  absl::Time created;
  absl::Duration timeout;
  v1::WatchdogPolicy policy = v1::WATCHDOG_POLICY_UNSPECIFIED;
  std::string description;             // the first rank's (every rank's: the join checks); bounded
  v1::CollectiveSettings collectives;  // effective: the config's with the first rank's overrides
  server::TimerId timer = 0;
  std::vector<uint64_t> asks_made;  // AllocateSymmetric calls per rank = next round index
  std::map<uint64_t, Round> rounds;
  std::map<uint64_t, SymmetricBuffers> allocations;  // by allocation id (rank 0's)
  std::optional<absl::Status> aborted;               // ABORTED once the group was aborted
  // A group that spans nodes: its size over every node (0 for a node-local group), this
  // node's part in the cluster (from the local rendezvous until the last local rank leaves)
  // and, once every node's part came, the layout every rank learns.
  int global_world_size = 0;
  std::shared_ptr<SpanWait> span;
  v1::GroupLayout layout;

  uid_t uid() const { return std::get<0>(key); }
  const std::string& job() const { return std::get<1>(key); }
  const std::string& name() const { return std::get<2>(key); }
  bool spanning() const { return global_world_size > world_size; }
};

// The group as readers see it, holding its control blocks mapped.
GroupSnapshot SnapshotOf(const Group& group);

// "rank 2 (pid 4711) exited: killed by SIGKILL", "rank 2 (pid 4711) exited with status 3",
// "rank 2 (pid 4711) closed its session".
// `spanning`: the rank's group, named by global rank and node when it spans nodes.
std::string DepartureText(int rank, int64_t pid, const server::SessionEnd& end,
                          const Group* spanning = nullptr);
// "[0, 2]"
std::string RankList(const std::vector<int>& ranks);

}  // namespace commd::groups

#endif  // COMMD_DAEMON_GROUPS_GROUP_STATE_H_
