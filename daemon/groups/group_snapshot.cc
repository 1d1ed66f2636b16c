#include "daemon/groups/group_snapshot.h"

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace commd::groups {

bool GroupSelector::Selects(uid_t uid, const std::string& job_id, const std::string& name) const {
  if (job && (job->first != uid || job->second != job_id)) return false;
  if (job_any_uid && *job_any_uid != job_id) return false;
  return group.empty() || group == name;
}

absl::StatusOr<GroupSelector> SelectorFor(const server::Session& session, const std::string& job,
                                          bool all_jobs, const std::string& group) {
  GroupSelector f;
  f.group = group;
  const bool other_job = !job.empty() && job != session.job_id;
  if ((other_job || all_jobs) && !session.admin) {
    return absl::NotFoundError(absl::StrCat("no job ", all_jobs ? "(all)" : QuoteForError(job),
                                            " visible to this session"));
  }
  if (all_jobs) return f;
  if (other_job) {
    f.job_any_uid = job;
  } else {
    f.job = std::make_pair(session.uid, session.job_id);
  }
  return f;
}

std::vector<const GroupSnapshot*> Select(const GroupsSnapshot& snapshot,
                                         const GroupSelector& selector, bool active_only) {
  std::vector<const GroupSnapshot*> out;
  for (const GroupSnapshot& g : snapshot.groups) {
    if ((g.active || !active_only) && selector.Selects(g)) out.push_back(&g);
  }
  return out;
}

}  // namespace commd::groups
