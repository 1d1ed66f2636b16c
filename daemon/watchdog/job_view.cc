#include "daemon/watchdog/job_view.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "format/job_diagnosis.h"

namespace commd::watchdog {

std::optional<std::string> JobViewRefusal(uint32_t uid, uint64_t group_id,
                                          const std::vector<JobViewWaiter>& waiting) {
  size_t of_uid = 0;
  for (const JobViewWaiter& w : waiting) {
    if (w.group_id == group_id) {
      return absl::StrCat(kJobViewUnavailable,
                          ": the group's previous finding is still reading it; this diagnosis "
                          "is this node's alone");
    }
    of_uid += w.uid == uid ? 1 : 0;
  }
  if (of_uid < kMaxJobViewWaitsPerUid) return std::nullopt;
  return absl::StrCat(kJobViewUnavailable, ": uid ", uid, " has ", of_uid,
                      " findings reading the nodes' views already (at most ",
                      kMaxJobViewWaitsPerUid, "); this diagnosis is this node's alone");
}

v1::NodeGroupView LocalView(const v1::Diagnosis& d, const v1::GroupLayout& layout) {
  v1::NodeGroupView v;
  if (layout.this_node() >= 0 && layout.this_node() < layout.nodes_size()) {
    v.set_node(layout.nodes(layout.this_node()).node());
  }
  v1::GroupHealth* h = v.mutable_health();
  h->set_job_id(d.job_id());
  h->set_uid(d.uid());
  h->set_group(d.group());
  *v.mutable_ranks() = d.ranks();
  return v;
}

std::string JobViewSummary(const absl::StatusOr<std::vector<v1::NodeGroupView>>& views,
                           const v1::NodeGroupView& local, const v1::GroupLayout& layout) {
  if (!views.ok()) {
    return absl::StrCat(kJobViewUnavailable, ": ", views.status().message(),
                        "; this diagnosis is node ", local.node(), "'s alone");
  }
  std::set<std::string> in_layout;
  for (const v1::NodeRanks& n : layout.nodes()) in_layout.insert(n.node());
  std::vector<const v1::NodeGroupView*> of_group = {&local};
  std::set<std::string> seen = {local.node()};
  for (const v1::NodeGroupView& v : *views) {
    if (v.health().group() != local.health().group() || !in_layout.contains(v.node()) ||
        !seen.insert(v.node()).second) {
      continue;
    }
    of_group.push_back(&v);
  }
  std::vector<std::string> missing;
  size_t unnamed = 0;
  for (const std::string& node : in_layout) {
    if (seen.contains(node)) continue;
    if (missing.size() < diagnosis::kMaxNodesNamed) {
      missing.push_back(node);
    } else {
      ++unnamed;
    }
  }
  if (unnamed > 0) missing.push_back(absl::StrCat("and ", unnamed, " more"));
  std::string out;
  if (std::optional<std::string> s = diagnosis::GroupHoldup(of_group)) {
    out = std::move(*s);
  } else {
    out = absl::StrCat("group ", local.health().group(), ": no global rank is behind in the ",
                       of_group.size(), " node(s)' views");
  }
  if (!missing.empty()) {
    absl::StrAppend(&out, "; no view from node(s) ", absl::StrJoin(missing, ", "));
  }
  return out;
}

}  // namespace commd::watchdog
