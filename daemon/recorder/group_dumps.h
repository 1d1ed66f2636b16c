// Dumps of groups: the one place that turns "dump these groups" into dump sources (from the
// group registry's snapshot) and hands them to the Dumper. Every trigger goes through it: a
// rank's death, a watchdog finding, an operator's abort, the Dump RPC, SIGUSR1.
//
//   group_dumps.DumpGroups({.job = {{uid, job}}, .group = "g"}, "hang-stuck", diagnosis);
//
// Thread-safe (the snapshot is immutable; the Dumper is thread-safe).
#ifndef COMMD_DAEMON_RECORDER_GROUP_DUMPS_H_
#define COMMD_DAEMON_RECORDER_GROUP_DUMPS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/groups/group_registry.h"
#include "daemon/groups/group_snapshot.h"
#include "daemon/recorder/dumper.h"
#include "nlohmann/json.hpp"

namespace commd::recorder {

// Every rank of `group` whose control block exists, kept mapped for the dump.
std::vector<DumpSource> DumpSourcesOf(const groups::GroupSnapshot& group);

struct DumpHow {
  // Queued on the dumper's thread and charged to the group's uid (whoever noticed never waits),
  // or written now and the result returned.
  bool now = false;
  std::optional<uid_t> charge;  // now only: the uid whose dump rate it takes (none: free)
};

class GroupDumps {
 public:
  // `groups` and `dumper` must outlive this object.
  GroupDumps(const groups::GroupRegistry* groups, Dumper* dumper)
      : groups_(groups), dumper_(dumper) {}

  // Dumps the formed groups `selector` picks as they are now. NOT_FOUND ("no formed group 'g'
  // to dump") when it picks none; a queued dump returns an empty result.
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

  const groups::GroupRegistry* const groups_;
  Dumper* const dumper_;
};

}  // namespace commd::recorder

#endif  // COMMD_DAEMON_RECORDER_GROUP_DUMPS_H_
