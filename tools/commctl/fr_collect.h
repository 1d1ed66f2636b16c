// `commctl fr collect`: every node's files of one dump of a job that spans nodes, put into one
// directory, so that one `commctl fr export` + torchfrtrace run covers every global rank.
//
//   ASSIGN_OR_RETURN(CollectResult r, CollectDump({"/mnt/dumps"}, "20261124T...-node-a", "out"));
//
// Each source is a node's dump_dir (or a copy of it: <job>/<dump id>/<group>/...), a job's
// directory in one (<dump id>/<group>/...), or a dump's directory itself. On a dump_dir that
// the nodes share (a network filesystem, the common case) one source holds every node's files
// already; copies from each node are merged. Files are copied, never moved; the same file met
// twice (a source named twice) is taken once, and two different files of the same name (two
// nodes claiming one global rank) are refused naming both. Not thread-safe with writers of
// `out_dir`.
#ifndef COMMD_TOOLS_COMMCTL_FR_COLLECT_H_
#define COMMD_TOOLS_COMMCTL_FR_COLLECT_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace commd::ctl {

struct CollectedGroup {
  std::set<int> ranks;     // global ranks with a rank<N>.json
  std::set<int> expected;  // the group's global ranks as its dumps' pg_config states them
};

struct CollectResult {
  std::vector<std::string> directories;          // the dump directories found
  std::map<std::string, CollectedGroup> groups;  // by group directory name
  int files = 0;                                 // files copied
};

// NOT_FOUND when no source holds the dump; INVALID_ARGUMENT for a dump id outside a job id's
// alphabet (it names a directory) or for conflicting files; the filesystem's error otherwise.
absl::StatusOr<CollectResult> CollectDump(const std::vector<std::string>& sources,
                                          const std::string& dump_id, const std::string& out_dir);

// "group g: global ranks 0-3 (4 of 4)" lines, with the ranks missing when some are.
std::string FormatCollect(const CollectResult& result, const std::string& dump_id,
                          const std::string& out_dir);

}  // namespace commd::ctl

#endif  // COMMD_TOOLS_COMMCTL_FR_COLLECT_H_
