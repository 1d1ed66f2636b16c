// The watchdog's job-wide sentence for a finding on a group spanning nodes (docs/cluster.md,
// "The watchdog's job-wide sentence"): from every node's published view of the group (read from
// etcd through ClusterViews) and this node's own ranks as the finding saw them, which global
// ranks on which nodes hold the group back (format/job_diagnosis.h says it), or why the
// job-wide view is unavailable.
//
//   v1::Diagnosis d = ...;  // the finding, this node's ranks in d.ranks()
//   d.set_job_summary(JobViewSummary(views_or_error, LocalView(d, layout), layout));
//
// Pure functions; thread-compatible.
#ifndef COMMD_DAEMON_WATCHDOG_JOB_VIEW_H_
#define COMMD_DAEMON_WATCHDOG_JOB_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "commd/v1/groups.pb.h"
#include "commd/v1/health.pb.h"

namespace commd::watchdog {

// Prefixes the summary when the nodes' views could not be read; the rest says why.
inline constexpr char kJobViewUnavailable[] = "other nodes' views unavailable";

// The most findings of one uid's spanning groups that wait for the nodes' views at once on a
// node; more go ahead at once with this node's diagnosis alone, saying so.
inline constexpr size_t kMaxJobViewWaitsPerUid = 8;

// A finding waiting for the nodes' views: whose group it is.
struct JobViewWaiter {
  uint32_t uid = 0;
  uint64_t group_id = 0;
};

// Why a finding on group `group_id` of `uid` may not wait for the nodes' views, given the
// findings waiting already: at most one per group, kMaxJobViewWaitsPerUid per uid. nullopt
// when it may; else the finding's job summary ("other nodes' views unavailable: ...").
std::optional<std::string> JobViewRefusal(uint32_t uid, uint64_t group_id,
                                          const std::vector<JobViewWaiter>& waiting);

// This node's view of the group as the finding `d` saw its ranks (fresher than what this node
// last published, which is at most one a second).
v1::NodeGroupView LocalView(const v1::Diagnosis& d, const v1::GroupLayout& layout);

// The finding's job-wide summary. With the nodes' views: this node's published view replaced by
// `local`, views of nodes outside `layout` (another formation's) left out, then the sentence
// naming who holds the group back, with the nodes that have no view named; or, when the views
// name no one, a sentence that says so. Without them (`views` an error): "job-wide view
// unavailable: <why>; this diagnosis is node <node>'s alone".
std::string JobViewSummary(const absl::StatusOr<std::vector<v1::NodeGroupView>>& views,
                           const v1::NodeGroupView& local, const v1::GroupLayout& layout);

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_JOB_VIEW_H_
