#include "daemon/recorder/group_dumps.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::recorder {

std::vector<DumpSource> DumpSourcesOf(const groups::GroupSnapshot& g) {
  std::vector<int> global_ranks;
  for (const groups::MemberSnapshot& m : g.members) global_ranks.push_back(m.global_rank);
  std::vector<DumpSource> out;
  for (const groups::MemberSnapshot& m : g.members) {
    if (m.block == nullptr) continue;
    out.push_back({.job_id = g.job_id,
                   .uid = g.uid,
                   .group = g.name,
                   .group_description = g.description,
                   .group_id = g.id,
                   .rank = m.rank,
                   .global_rank = m.global_rank,
                   .world_size = g.world_size,
                   .pid = m.pid,
                   .device = m.device,
                   .group_global_ranks = global_ranks,
                   .block = m.block});
  }
  return out;
}

absl::StatusOr<DumpResult> GroupDumps::DumpGroups(const groups::GroupSelector& selector,
                                                  const std::string& trigger,
                                                  std::optional<nlohmann::json> diagnosis,
                                                  DumpHow how) {
  const std::shared_ptr<const groups::GroupsSnapshot> now = groups_->Snapshot();
  std::vector<DumpSource> sources;
  for (const groups::GroupSnapshot* g : groups::Select(*now, selector, /*active_only=*/true)) {
    for (DumpSource& s : DumpSourcesOf(*g)) sources.push_back(std::move(s));
  }
  return DumpSources(std::move(sources), selector.group, trigger, std::move(diagnosis), how);
}

absl::StatusOr<DumpResult> GroupDumps::DumpGroups(const groups::GroupSnapshot& group,
                                                  const std::string& trigger,
                                                  std::optional<nlohmann::json> diagnosis,
                                                  DumpHow how) {
  return DumpSources(DumpSourcesOf(group), group.name, trigger, std::move(diagnosis), how);
}

absl::StatusOr<DumpResult> GroupDumps::DumpSources(std::vector<DumpSource> sources,
                                                   const std::string& group,
                                                   const std::string& trigger,
                                                   std::optional<nlohmann::json> diagnosis,
                                                   DumpHow how) {
  if (sources.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no formed group", group.empty() ? "" : " " + QuoteForError(group), " to dump"));
  }
  if (!how.now) {
    dumper_->DumpLater(trigger, std::move(sources), std::move(diagnosis));
    return DumpResult{};
  }
  if (how.charge) RETURN_IF_ERROR(dumper_->Admit(*how.charge, trigger));
  return dumper_->Dump(trigger, sources, diagnosis);
}

}  // namespace commd::recorder
