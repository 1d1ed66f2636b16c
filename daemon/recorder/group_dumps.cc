#include "daemon/recorder/group_dumps.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::recorder {

std::vector<DumpSource> DumpSourcesOf(const groups::GroupSnapshot& g) {
  // The group's global ranks (pg_config's "ranks"): every node's, for a group that spans nodes,
  // so that the dumps of its nodes, collected, tell which ranks are missing.
  std::vector<int> global_ranks;
  for (const v1::NodeRanks& n : g.layout.nodes()) {
    global_ranks.insert(global_ranks.end(), n.global_ranks().begin(), n.global_ranks().end());
  }
  std::sort(global_ranks.begin(), global_ranks.end());
  if (global_ranks.empty()) {
    for (const groups::MemberSnapshot& m : g.members) global_ranks.push_back(m.global_rank);
  }
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

std::string GroupDumps::MintDumpId(const std::string& trigger) {
  std::string id = NewDumpId(trigger, publisher_->node_name());
  absl::MutexLock lock(&mint_mu_);
  if (id != last_minted_) {
    last_minted_ = id;
    repeats_ = 0;
    return id;
  }
  return absl::StrCat(id, "-", ++repeats_ + 1);
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
  const bool one_job = std::all_of(sources.begin(), sources.end(), [&](const DumpSource& s) {
    return s.uid == sources.front().uid && s.job_id == sources.front().job_id;
  });
  // A shared id (one every node derives alike, or another node's announcement) is dumped
  // once per node, by whichever comes first.
  if (!how.shared_id.empty() && one_job &&
      AlreadyDumped(sources.front().uid, sources.front().job_id, how.shared_id)) {
    return absl::AlreadyExistsError(absl::StrCat("dump ", how.shared_id, " of job ",
                                                 sources.front().job_id, " is written here"));
  }
  const bool announce = publisher_ != nullptr && how.dump_id.empty() && !how.local_only && one_job;
  if (!how.shared_id.empty()) {
    how.dump_id = how.shared_id;
  } else if (announce) {
    how.dump_id = MintDumpId(trigger);
  }
  if (announce && !how.announce_group_only) {
    // The job's dump, here as on the other nodes: its other formed groups too.
    const uid_t uid = sources.front().uid;
    const std::string job = sources.front().job_id;
    std::set<uint64_t> have;
    for (const DumpSource& s : sources) have.insert(s.group_id);
    const std::shared_ptr<const groups::GroupsSnapshot> now = groups_->Snapshot();
    const groups::GroupSelector whole_job{.job = std::make_pair(uid, job)};
    for (const groups::GroupSnapshot* g : groups::Select(*now, whole_job, /*active_only=*/true)) {
      if (have.count(g->id) > 0) continue;
      for (DumpSource& s : DumpSourcesOf(*g)) sources.push_back(std::move(s));
    }
  }
  DumpResult result;
  // Charged before it is announced: a refused dump is not announced either, so a uid's dump
  // rate bounds what it can make the other nodes write. A dump written now is announced once
  // its files are written, so a failed one announces nothing.
  if (how.now) {
    if (how.charge) RETURN_IF_ERROR(dumper_->Admit(*how.charge, trigger));
    absl::StatusOr<DumpResult> written = dumper_->Dump(trigger, sources, diagnosis, how.dump_id);
    if (!written.ok()) return written.status();
    result = std::move(*written);
  } else {
    RETURN_IF_ERROR(dumper_->DumpLater(trigger, sources, diagnosis, how.dump_id));
  }
  result.dump_id = how.dump_id;
  result.announced = announce;
  if (announce) {
    auto done = how.announced ? std::move(how.announced) : [id = how.dump_id](absl::Status s) {
      if (!s.ok()) {
        COMMD_LOG(WARNING, "recorder")
            << "dump " << id << " not announced to the job's other nodes: " << s;
      }
    };
    publisher_->Publish({.uid = sources.front().uid,
                         .job_id = sources.front().job_id,
                         .group = how.announce_group_only ? group : "",
                         .trigger = trigger,
                         .dump_id = how.dump_id,
                         .diagnosis = std::move(diagnosis)},
                        std::move(done));
  }
  return result;
}

bool GroupDumps::AlreadyDumped(uid_t uid, const std::string& job, const std::string& id) {
  std::string key = absl::StrCat(uid, "/", job, "/", id);
  absl::MutexLock lock(&mint_mu_);
  if (std::find(remembered_.begin(), remembered_.end(), key) != remembered_.end()) return true;
  remembered_.push_back(std::move(key));
  if (remembered_.size() > kRememberedIds) remembered_.pop_front();
  return false;
}

}  // namespace commd::recorder
