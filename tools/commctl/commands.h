// commctl's commands, separate from main() so each is a plain function of its arguments.
#ifndef COMMD_TOOLS_COMMCTL_COMMANDS_H_
#define COMMD_TOOLS_COMMCTL_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "commd/commd.h"

namespace commd::ctl {

struct GlobalOptions {
  std::string runtime_dir;  // empty: $COMMD_RUNTIME_DIR, then the default
  bool json = false;
  absl::Duration timeout = absl::Seconds(5);
  std::string job;    // --job: empty means the client's ($COMMD_JOB_ID or "commctl")
  std::string group;  // --group
  std::string in_dir, out_dir, format;  // fr export
  std::string dump_id;                  // fr collect --dump-id
  bool local = false;                   // dump --local: this node only
  bool cluster = false;                 // health --cluster: every node's view
  std::string reason;                   // abort --reason
  uint32_t limit = 0;                   // cluster nodes --limit: 0 for the daemon's most
  std::string after;                    // cluster nodes --after NAME: the next page
};

// Parses global flags wherever they appear; what remains is the command and its arguments.
absl::Status ParseArgs(int argc, const char* const* argv, GlobalOptions* options,
                       std::vector<std::string>* rest);

const char* Usage();

// Runs `args[0]` with its arguments, printing to `out`.
absl::Status RunCommand(const GlobalOptions& options, const std::vector<std::string>& args,
                        std::ostream& out);

// Text forms, exposed for tests.
std::string FormatStatus(const v1::NodeStatus& status);
// One row per group; a DEVICES column ("cuda:0=0,1 cuda:1=2") when a rank is on a GPU, so
// ranks sharing a device read as one entry.
std::string FormatGroups(const v1::ListGroupsResponse& groups);
std::string FormatDuration(int64_t ms);
std::string FormatHealth(const v1::GetHealthResponse& health);
std::string FormatClusterHealth(const v1::GetHealthResponse& health);
// `now_ms`: the Unix time the ages are counted to.
std::string FormatClusterNodes(const v1::ListClusterNodesResponse& nodes, int64_t now_ms);

}  // namespace commd::ctl

#endif  // COMMD_TOOLS_COMMCTL_COMMANDS_H_
