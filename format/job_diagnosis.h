// The job-wide sentence of a group spanning nodes (docs/cluster.md, "Every node's view of the
// job"): over every node's view of the group (v1::NodeGroupView, as each daemon publishes it in
// etcd), which global ranks on which nodes hold the group back, and which wait on them. The
// watchdog puts it into its finding on a spanning group (Diagnosis.job_summary) and `commctl
// health --cluster` prints it under its table: one implementation for both, outside daemon/ so
// that commctl links no daemon library.
//
//   std::vector<const v1::NodeGroupView*> views = ...;  // one group, one per node
//   std::optional<std::string> s = GroupHoldup(views);
//   // "group g: global rank 3 on node-b never entered collective 5 that global ranks 0-2 wait
//   //  in (3 of 4 ranks entered it)"
//
// Pure functions of their arguments; thread-compatible.
#ifndef COMMD_FORMAT_JOB_DIAGNOSIS_H_
#define COMMD_FORMAT_JOB_DIAGNOSIS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "commd/v1/health.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace commd::diagnosis {

// What one sentence names at most, so that it stays a line on any job (a dump announcement
// carries the diagnosis only up to 16 KiB): nodes whose ranks hold the group back, and runs of
// ranks in one list; the rest is counted ("and 3 more nodes (12 global ranks)").
inline constexpr size_t kMaxNodesNamed = 8;
inline constexpr size_t kMaxRunsNamed = 16;

// "0-3, 5, 7-8": runs of consecutive ranks as ranges, ascending; after `max_runs` runs the rest
// is counted ("0, 2, 4, and 5 more"). "" for none.
std::string RankRanges(const std::set<int>& ranks, size_t max_runs = SIZE_MAX);

// What holds one group back over its nodes' views (all of one group, one per node): the global
// ranks, by node, that have not entered the newest collective any rank entered ("never entered
// collective N that global ranks ... wait in"), else those that have not finished it ("did not
// finish collective N that global ranks ... finished"). nullopt when every rank is level, or
// no rank entered any collective.
std::optional<std::string> GroupHoldup(absl::Span<const v1::NodeGroupView* const> views);

// GroupHoldup for each group of `views` (any order), by group name: one sentence per group that
// waits on some of its ranks.
std::vector<std::string> JobDiagnosis(
    const google::protobuf::RepeatedPtrField<v1::NodeGroupView>& views);

}  // namespace commd::diagnosis

#endif  // COMMD_FORMAT_JOB_DIAGNOSIS_H_
