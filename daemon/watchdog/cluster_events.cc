#include "daemon/watchdog/cluster_events.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace commd::watchdog {

namespace {

// A DEAD finding on `g` saying `summary`; the watchdog stamps its times.
v1::Diagnosis DeadDiagnosis(const groups::GroupSnapshot& g, std::string summary) {
  v1::Diagnosis d;
  d.set_kind(v1::DEAD);
  d.set_job_id(g.job_id);
  d.set_uid(g.uid);
  d.set_group(g.name);
  d.set_summary(std::move(summary));
  return d;
}

}  // namespace

std::optional<ClusterFact> NodeGoneFact(const groups::GroupSnapshot& g, const std::string& node,
                                        int64_t revision, absl::string_view why) {
  const v1::GroupLayout& layout = g.layout;
  int index = -1;
  for (int i = 0; i < layout.nodes_size(); ++i) {
    if (layout.nodes(i).node() == node && i != layout.this_node()) index = i;
  }
  if (!g.active || index < 0) return std::nullopt;
  return ClusterFact{.group = g,
                     .diagnosis = DeadDiagnosis(
                         g, absl::StrCat("group ", g.name, ": node ", node, " (global rank(s) [",
                                         absl::StrJoin(layout.nodes(index).global_ranks(), ", "),
                                         "]) is gone: ", why)),
                     .key = absl::StrCat("node:", node),
                     .trigger = "node_lost",
                     .dump = {.dump_id = absl::StrCat("node_lost-", node, "-r", revision)}};
}

std::optional<ClusterFact> LeaseLostFact(const groups::GroupSnapshot& g, const std::string& why) {
  const v1::GroupLayout& layout = g.layout;
  if (!g.active || layout.nodes_size() < 2) return std::nullopt;
  const std::string node = layout.this_node() >= 0 && layout.this_node() < layout.nodes_size()
                               ? layout.nodes(layout.this_node()).node()
                               : std::string("?");
  return ClusterFact{
      .group = g,
      .diagnosis = DeadDiagnosis(
          g, absl::StrCat("group ", g.name, ": this node (", node, ") lost its lease in etcd (",
                          why, "); the group's other nodes count it as gone")),
      .key = "lease_lost",
      .trigger = "lease_lost",
      .dump = {.local_only = true}};
}

bool IsFormationOf(const groups::GroupSnapshot& g, const SpanAbortNotice& a) {
  return g.active && g.uid == a.uid && g.job_id == a.job_id && g.name == a.group &&
         g.layout.nodes_size() >= 2 && g.layout.formation() == a.formation;
}

std::string RemoteAbortText(const SpanAbortNotice& a) {
  return absl::StrCat("aborted on node ", a.node, ": ", a.text);
}

void ClusterEvents::OnNodeGone(const std::string& node, int64_t revision, absl::string_view why) {
  ActOnFacts([&](const groups::GroupSnapshot& g) { return NodeGoneFact(g, node, revision, why); });
}

void ClusterEvents::OnLeaseLost(const std::string& why) {
  ActOnFacts([&](const groups::GroupSnapshot& g) { return LeaseLostFact(g, why); });
}

void ClusterEvents::ActOnFacts(const FactOf& fact_of) {
  // The registry's groups, not only those the watchdog polled so far: one that formed since
  // the last poll may be one the fact is about.
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  std::vector<ClusterFact> facts;
  for (const groups::GroupSnapshot& g : groups->groups) {
    if (std::optional<ClusterFact> f = fact_of(g)) facts.push_back(std::move(*f));
  }
  watchdog_->ActOnFacts(std::move(facts));
}

int ClusterEvents::OnRemoteAbort(const SpanAbortNotice& a) {
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  int aborted = 0;
  for (const groups::GroupSnapshot& g : groups->groups) {
    if (IsFormationOf(g, a) && watchdog_->AbortForNode(g, a.reason, RemoteAbortText(a), a.node)) {
      ++aborted;
    }
  }
  return aborted;
}

}  // namespace commd::watchdog
