#include "daemon/watchdog/findings.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "daemon/watchdog/job_view.h"
#include "google/protobuf/util/json_util.h"

namespace commd::watchdog {

namespace {

nlohmann::json ToJson(const v1::Diagnosis& d) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(d, &text, options).ok()) return d.summary();
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// How a finding is dumped: as its cause says when it says (a node lost: under the id every
// node derives from the loss); a hang on a group spanning nodes under an id every node derives
// alike (the group, its formation and the collective), so that nodes that find the same hang
// make one dump of the job between them; else under a fresh id.
recorder::DumpHow DumpHowOf(const groups::GroupSnapshot& g, const v1::Diagnosis& d, bool fact,
                            recorder::DumpHow how) {
  if (fact || g.layout.nodes_size() == 0 || !how.dump_id.empty() || how.local_only) {
    return how;
  }
  return {.shared_id = recorder::DumpIdOf(
              absl::StrCat("hang-", g.name, "-f", g.layout.formation(), "-s", d.seq()))};
}

}  // namespace

const char* KindLabel(v1::DiagnosisKind kind) {
  switch (kind) {
    case v1::STUCK:
      return "stuck";
    case v1::LAGGING:
      return "lagging";
    case v1::MISMATCH:
      return "mismatch";
    case v1::DEAD:
      return "dead";
    case v1::UNRESPONSIVE:
      return "unresponsive";
    case v1::RENDEZVOUS:
      return "rendezvous";
    default:
      return "unknown";
  }
}

AbortReason ReasonOf(v1::DiagnosisKind kind) {
  switch (kind) {
    case v1::STUCK:
      return AbortReason::kStuck;
    case v1::LAGGING:
      return AbortReason::kLagging;
    case v1::MISMATCH:
      return AbortReason::kMismatch;
    case v1::DEAD:
      return AbortReason::kPeerDead;
    default:
      return AbortReason::kUnresponsive;
  }
}

Finding DecideFinding(const groups::GroupSnapshot& g, const v1::Diagnosis& d,
                      v1::WatchdogPolicy policy, const Cause& cause) {
  const bool fact = IsFact(cause);
  return {.group = g,
          // A death's group is dumped as it was when the rank died: it may have retired since.
          .dump_as_taken = cause.death != nullptr,
          .d = d,
          .policy = policy,
          .trigger = cause.death != nullptr     ? std::string("rank_death")
                     : cause.trigger != nullptr ? std::string(cause.trigger)
                                                : absl::StrCat("hang-", KindLabel(d.kind())),
          .how = DumpHowOf(g, d, fact, cause.dump),
          .abort = fact || policy == v1::NOTIFY || policy == v1::TERMINATE,
          .announce = cause.announce,
          .terminate = policy == v1::TERMINATE};
}

Findings::Findings(FindingsOptions options, groups::GroupRegistry* groups,
                   recorder::GroupDumps* dumps, RankSignals* signals, JobSummarySink job_summary)
    : options_(options),
      groups_(groups),
      dumps_(dumps),
      signals_(signals),
      job_summary_(std::move(job_summary)) {}

void Findings::Carry(const Finding& f) {
  const groups::GroupSnapshot& g = f.group;
  const v1::Diagnosis& d = f.d;
  COMMD_LOG(WARNING, "watchdog") << g.job_id << "/" << g.name << ": " << KindLabel(d.kind()) << ": "
                                 << d.summary() << (d.job_summary().empty() ? "" : "; job-wide: ")
                                 << d.job_summary() << " (policy "
                                 << v1::WatchdogPolicy_Name(f.policy) << ")";
  if (f.dump_as_taken) {
    (void)dumps_->DumpGroups(g, f.trigger, ToJson(d), f.how);
  } else {
    (void)dumps_->DumpGroups(
        groups::GroupSelector{.job = std::make_pair(g.uid, g.job_id), .group = g.name}, f.trigger,
        ToJson(d), f.how);
  }
  if (f.abort) {
    const AbortReason reason = ReasonOf(d.kind());
    bool first = false;
    signals_->Notify(g, reason, d.summary(), &first);
    groups_->Abort(g.id, absl::StrCat("by the watchdog: ", d.summary()));
    // Only the group's first abort here: one that came from another node is not echoed.
    if (first && f.announce) Announce(g, reason, d.summary());
  }
  // After the dump has taken its sources: the group retires once every rank is gone.
  if (f.terminate) signals_->Terminate(g);
}

std::optional<std::string> Findings::WaitForJobView(Finding f, const std::string& acted_key,
                                                    Deferred& deferred) {
  const groups::GroupSnapshot& g = f.group;
  absl::MutexLock lock(&mu_);
  std::vector<JobViewWaiter> waiting;
  for (const auto& [n, w] : job_views_) {
    waiting.push_back({.uid = w.finding.group.uid, .group_id = w.finding.group.id});
  }
  if (std::optional<std::string> refused = JobViewRefusal(g.uid, g.id, waiting)) {
    f.d.set_job_summary(*refused);
    deferred.push_back([this, f = std::move(f)] { Carry(f); });
    return refused;
  }
  // The ranks may have left by the time the views come (an abort from another node): the dump
  // is of the group as the finding saw it, its blocks kept mapped meanwhile.
  f.dump_as_taken = true;
  const uint64_t n = ++job_view_seq_;
  deferred.push_back([this, n, uid = g.uid, job = g.job_id, group = g.name] {
    options_.views->Read(uid, job, group,
                         [this, n](absl::StatusOr<std::vector<v1::NodeGroupView>> views) {
                           FinishJobView(n, std::move(views));
                         });
  });
  v1::NodeGroupView local = LocalView(f.d, g.layout);
  job_views_.emplace(n, JobViewWait{.finding = std::move(f),
                                    .acted_key = acted_key,
                                    .local = std::move(local),
                                    .deadline = absl::Now() + options_.job_view_wait});
  return std::nullopt;
}

void Findings::FinishJobView(uint64_t wait, absl::StatusOr<std::vector<v1::NodeGroupView>> views) {
  JobViewWait w;
  {
    absl::MutexLock lock(&mu_);
    auto it = job_views_.find(wait);
    if (it == job_views_.end()) return;  // finished already: its deadline passed, or the answer
    w = std::move(it->second);
    job_views_.erase(it);
  }
  const std::string summary = JobViewSummary(views, w.local, w.finding.group.layout);
  w.finding.d.set_job_summary(summary);
  job_summary_(w.finding.group.id, w.acted_key, summary);
  Carry(w.finding);
}

void Findings::ExpireJobViews(absl::Time now) {
  std::vector<uint64_t> due;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [n, w] : job_views_) {
      if (w.deadline <= now) due.push_back(n);
    }
  }
  for (uint64_t n : due) {
    FinishJobView(
        n, absl::DeadlineExceededError(absl::StrCat("etcd did not answer within ",
                                                    absl::FormatDuration(options_.job_view_wait))));
  }
}

absl::Time Findings::NextJobViewDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [n, w] : job_views_) next = std::min(next, w.deadline);
  return next;
}

void Findings::Announce(const groups::GroupSnapshot& g, AbortReason reason,
                        const std::string& text) {
  if (options_.aborts == nullptr || !g.active || g.layout.nodes_size() < 2) return;
  options_.aborts->Announce({.uid = g.uid,
                             .job_id = g.job_id,
                             .group = g.name,
                             .formation = g.layout.formation(),
                             .reason = reason,
                             .text = text});
}

}  // namespace commd::watchdog
