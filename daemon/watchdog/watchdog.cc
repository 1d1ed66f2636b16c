#include "daemon/watchdog/watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/control_block_admin.h"
#include "common/log.h"
#include "common/names.h"
#include "daemon/recorder/ring_reader.h"
#include "daemon/watchdog/job_view.h"
#include "google/protobuf/util/json_util.h"

namespace commd::watchdog {

namespace {

constexpr size_t kRetiredKept = 64;

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

nlohmann::json ToJson(const v1::Diagnosis& d) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(d, &text, options).ok()) return d.summary();
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

Watchdog::Watchdog(WatchdogOptions options, groups::GroupRegistry* groups,
                   recorder::GroupDumps* dumps, PushEvent push, prometheus::Registry* registry,
                   std::unique_ptr<RecorderClock> clock)
    : options_(options),
      groups_(groups),
      dumps_(dumps),
      clock_(std::move(clock)),
      signals_(std::move(push), clock_.get(), group_metrics_.get(), options.terminate_grace) {
  prometheus::Histogram::BucketBoundaries poll_buckets;
  for (double v = 1e-6; v < 10; v *= 4) poll_buckets.push_back(v);
  poll_seconds_ = &prometheus::BuildHistogram()
                       .Name("commd_watchdog_poll_duration_seconds")
                       .Help("Time one watchdog poll of every group takes")
                       .Register(*registry)
                       .Add({}, poll_buckets);
}

Watchdog::~Watchdog() { Stop(); }

void Watchdog::Start() {
  absl::MutexLock lock(&run_mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Run(); });
}

void Watchdog::Stop() {
  {
    absl::MutexLock lock(&run_mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  ExpireJobViews(absl::InfiniteFuture());
}

void Watchdog::Run() {
  absl::Time next = absl::Now() + options_.poll_interval;
  for (;;) {
    {
      // Also woken at the deadline of a finding that waits for the nodes' views, whatever the
      // poll interval.
      const absl::Time wake = std::min(next, NextJobViewDeadline());
      absl::MutexLock lock(&run_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_) { return stopping_; };
      if (run_mu_.AwaitWithDeadline(absl::Condition(&stop), wake)) return;
    }
    const absl::Time start = absl::Now();
    ExpireJobViews(start);
    if (start < next) continue;
    PollOnce();
    const absl::Time end = absl::Now();
    poll_seconds_->Observe(absl::ToDoubleSeconds(end - start));
    if (next < end) next = end;  // a slow poll does not cause a burst of catch-up polls
    next += options_.poll_interval;
  }
}

absl::Duration Watchdog::TimeoutOf(const groups::GroupSnapshot& g) const {
  return std::min(g.timeout, options_.max_timeout);
}

v1::WatchdogPolicy Watchdog::PolicyOf(const groups::GroupSnapshot& g) const {
  return g.policy == v1::WATCHDOG_POLICY_UNSPECIFIED ? options_.policy : g.policy;
}

void Watchdog::ReadRank(const groups::MemberSnapshot& m, RankCursor& c, uint64_t now_ns,
                        const groups::GroupSnapshot& g) {
  group_metrics_->ObserveDurations(g.job_id, g.name, c.Read(m, now_ns));
}

void Watchdog::PollGroup(Tracked& t, uint64_t now_ns, Deferred& deferred) {
  const groups::GroupSnapshot& g = t.info;
  if (t.ranks.size() != g.members.size()) t.ranks.resize(g.members.size());
  GroupView view;
  view.job_id = g.job_id;
  view.uid = g.uid;
  view.group = g.name;
  bool aborted = false;
  for (size_t r = 0; r < g.members.size(); ++r) {
    ReadRank(g.members[r], t.ranks[r], now_ns, g);
    view.ranks.push_back(t.ranks[r].last);
    aborted = aborted || t.ranks[r].abort_reason != 0;
  }
  // The classifier compares entries from the frontier on; copy only those.
  const uint64_t frontier = FrontierSeq(view);
  for (size_t r = 0; r < view.ranks.size(); ++r) {
    const auto& entries = t.ranks[r].entries;
    for (auto it = entries.lower_bound(frontier); it != entries.end() && it->first < frontier + 8;
         ++it) {
      view.ranks[r].entries.insert(*it);
    }
  }
  t.tracker.Observe(&view, now_ns);
  const Thresholds thresholds{
      .timeout_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(TimeoutOf(g))),
      .heartbeat_timeout_ns =
          static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.heartbeat_timeout))};
  // Prune entries the whole group has finished with.
  for (RankCursor& c : t.ranks) {
    c.entries.erase(
        c.entries.begin(),
        c.entries.lower_bound(view.frontier_seq > 1 ? view.frontier_seq - 1 : view.frontier_seq));
  }
  std::optional<v1::Diagnosis> d = Classify(view, thresholds, now_ns);
  if (d.has_value()) {
    const std::string key = absl::StrCat(d->kind(), ":", d->seq());
    // Deaths are acted upon by OnRankDeath, which the registry calls once for each.
    const bool died =
        d->kind() == v1::DEAD && std::all_of(d->ranks_dead().begin(), d->ranks_dead().end(),
                                             [&](int r) { return g.members[r].died; });
    if (key != t.acted_key && !aborted && !died) {
      t.acted_key = key;
      t.last = *d;
      Act(t, *d, deferred, Cause{});
    }
    t.state = t.abort_reason.empty() && !aborted ? v1::HUNG : v1::ABORTED;
  } else if (aborted || !t.abort_reason.empty()) {
    t.state = v1::ABORTED;
  } else {
    t.state = IsSuspect(view, thresholds, now_ns) ? v1::SUSPECT : v1::HEALTHY;
  }
  if (aborted && t.abort_reason.empty()) {
    for (size_t r = 0; r < t.ranks.size(); ++r) {
      if (t.ranks[r].abort_reason != 0) {
        const char* name = AbortReasonName(t.ranks[r].abort_reason);
        t.abort_reason = name != nullptr ? name : "unknown";
        break;
      }
    }
  }
  PublishMetrics(t);
  PublishProgress(t, now_ns, deferred);
}

namespace {

// How a finding is dumped: as its cause says when it says (a node lost: under the id every
// node derives from the loss); a hang on a group spanning nodes under an id every node derives
// alike (the group, its formation and the collective), so that nodes that find the same hang
// make one dump of the job between them; else under a fresh id.
recorder::DumpHow DumpHowOf(const groups::GroupSnapshot& g, const v1::Diagnosis& d, bool certain,
                            recorder::DumpHow how) {
  if (certain || g.layout.nodes_size() == 0 || !how.dump_id.empty() || how.local_only) {
    return how;
  }
  return {.shared_id = recorder::DumpIdOf(
              absl::StrCat("hang-", g.name, "-f", g.layout.formation(), "-s", d.seq()))};
}

}  // namespace

void Watchdog::Act(Tracked& t, const v1::Diagnosis& d, Deferred& deferred, const Cause& cause) {
  const groups::GroupSnapshot& g = t.info;
  const bool certain = cause.death != nullptr || cause.trigger != nullptr;
  const v1::WatchdogPolicy policy = PolicyOf(g);
  group_metrics_->CountHang(g.job_id, g.name, KindLabel(d.kind()));
  Finding f{.group = g,
            // A death's group is dumped as it was when the rank died: it may have retired since.
            .dump_as_taken = cause.death != nullptr,
            .d = d,
            .policy = policy,
            .trigger = cause.death != nullptr     ? std::string("rank_death")
                       : cause.trigger != nullptr ? std::string(cause.trigger)
                                                  : absl::StrCat("hang-", KindLabel(d.kind())),
            .how = DumpHowOf(g, d, certain, cause.dump),
            // A death is certain and the survivors can never complete with the dead rank:
            // waiting out their timeout would only hide what happened, so REPORT aborts it too.
            .abort = certain || policy == v1::NOTIFY || policy == v1::TERMINATE,
            .announce = cause.announce,
            .terminate = policy == v1::TERMINATE};
  if (f.abort) t.abort_reason = AbortReasonName(static_cast<uint32_t>(ReasonOf(d.kind())));
  // Only a suspicion on a group spanning nodes asks the other nodes who holds it back: a fact
  // (a death, a node or lease lost) names its cause already.
  if (!certain && options_.progress != nullptr && g.layout.nodes_size() >= 2) {
    WaitForJobView(t, std::move(f), deferred);
    return;
  }
  deferred.push_back([this, f = std::move(f)] { Carry(f); });
}

void Watchdog::Carry(const Finding& f) {
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
    signals_.Notify(g, reason, d.summary(), &first);
    groups_->Abort(g.id, absl::StrCat("by the watchdog: ", d.summary()));
    // Only the group's first abort here: one that came from another node is not echoed.
    if (first && f.announce) Announce(g, reason, d.summary());
  }
  // After the dump has taken its sources: the group retires once every rank is gone.
  if (f.terminate) signals_.Terminate(g);
}

void Watchdog::WaitForJobView(Tracked& t, Finding f, Deferred& deferred) {
  const groups::GroupSnapshot& g = t.info;
  std::vector<JobViewWaiter> waiting;
  for (const auto& [n, w] : job_views_) {
    waiting.push_back({.uid = w.finding.group.uid, .group_id = w.finding.group.id});
  }
  if (std::optional<std::string> refused = JobViewRefusal(g.uid, g.id, waiting)) {
    const std::string summary = std::move(*refused);
    f.d.set_job_summary(summary);
    SetJobSummary(g.id, t.acted_key, summary);
    deferred.push_back([this, f = std::move(f)] { Carry(f); });
    return;
  }
  // The ranks may have left by the time the views come (an abort from another node): the dump
  // is of the group as the finding saw it, its blocks kept mapped meanwhile.
  f.dump_as_taken = true;
  const uint64_t n = ++job_view_seq_;
  v1::NodeGroupView local = LocalView(f.d, g.layout);
  job_views_.emplace(n, JobViewWait{.finding = std::move(f),
                                    .acted_key = t.acted_key,
                                    .local = std::move(local),
                                    .deadline = absl::Now() + options_.job_view_wait});
  deferred.push_back([this, n, uid = g.uid, job = g.job_id, group = g.name] {
    options_.progress->Read(uid, job, group,
                            [this, n](absl::StatusOr<std::vector<v1::NodeGroupView>> views) {
                              FinishJobView(n, std::move(views));
                            });
  });
}

void Watchdog::FinishJobView(uint64_t wait, absl::StatusOr<std::vector<v1::NodeGroupView>> views) {
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
  {
    absl::MutexLock lock(&mu_);
    SetJobSummary(w.finding.group.id, w.acted_key, summary);
  }
  Carry(w.finding);
}

void Watchdog::ExpireJobViews(absl::Time now) {
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

absl::Time Watchdog::NextJobViewDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [n, w] : job_views_) next = std::min(next, w.deadline);
  return next;
}

void Watchdog::SetJobSummary(uint64_t group_id, const std::string& acted_key,
                             const std::string& summary) {
  Tracked* t = nullptr;
  if (auto it = tracked_.find(group_id); it != tracked_.end()) {
    t = &it->second;
  } else {
    for (Tracked& r : retired_) {
      if (r.info.id == group_id) t = &r;
    }
  }
  // A newer finding has its own sentence coming.
  if (t == nullptr || t->acted_key != acted_key || !t->last) return;
  t->last->set_job_summary(summary);
  ++t->job_view_gen;
}

void Watchdog::OnNodeGone(const std::string& node, int64_t revision) {
  // The registry's groups, not only those polled so far: one that formed since the last poll
  // spans the node too.
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    for (const groups::GroupSnapshot& g : groups->groups) {
      const v1::GroupLayout& layout = g.layout;
      int index = -1;
      for (int i = 0; i < layout.nodes_size(); ++i) {
        if (layout.nodes(i).node() == node && i != layout.this_node()) index = i;
      }
      if (!g.active || index < 0) continue;
      Tracked& t = Track(g);
      if (!t.abort_reason.empty()) continue;
      const v1::NodeRanks& lost = layout.nodes(index);
      v1::Diagnosis d;
      d.set_kind(v1::DEAD);
      d.set_job_id(t.info.job_id);
      d.set_uid(t.info.uid);
      d.set_group(t.info.name);
      d.set_detected_unix_ms(static_cast<int64_t>(now_ns / 1000000));
      d.set_since_unix_ms(d.detected_unix_ms());
      d.set_summary(absl::StrCat("group ", t.info.name, ": node ", node, " (global rank(s) [",
                                 absl::StrJoin(lost.global_ranks(), ", "),
                                 "]) is gone: its commd's lease in etcd ended"));
      t.acted_key = absl::StrCat("node:", node);
      t.last = d;
      t.state = v1::ABORTED;
      Act(t, d, deferred,
          {.trigger = "node_lost",
           .dump = {.dump_id = absl::StrCat("node_lost-", node, "-r", revision)},
           .announce = false});
      PublishMetrics(t);
    }
  }
  for (auto& f : deferred) f();
}

Watchdog::Tracked& Watchdog::Track(const groups::GroupSnapshot& g) {
  // The group may have formed since the last poll: it is tracked from here on.
  Tracked& t = tracked_[g.id];
  t.info = g;
  if (t.ranks.size() != g.members.size()) t.ranks.resize(g.members.size());
  return t;
}

void Watchdog::Announce(const groups::GroupSnapshot& g, AbortReason reason,
                        const std::string& text) {
  if (options_.aborts == nullptr || !g.active || g.layout.nodes_size() < 2) return;
  options_.aborts->Announce({.uid = g.uid,
                             .job_id = g.job_id,
                             .group = g.name,
                             .formation = g.layout.formation(),
                             .reason = reason,
                             .text = text});
}

int Watchdog::OnRemoteAbort(const SpanAbortNotice& a) {
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  int aborted = 0;
  for (const groups::GroupSnapshot& g : groups->groups) {
    if (!g.active || g.uid != a.uid || g.job_id != a.job_id || g.name != a.group ||
        g.layout.nodes_size() < 2 || g.layout.formation() != a.formation) {
      continue;
    }
    const std::string text = absl::StrCat("aborted on node ", a.node, ": ", a.text);
    bool first = false;
    signals_.Notify(g, a.reason, text, &first);
    if (!first) continue;  // aborted here already: its own cause and dump stand
    groups_->Abort(g.id, text);
    ++aborted;
    absl::MutexLock lock(&mu_);
    Tracked& t = Track(g);
    t.abort_reason = AbortReasonName(static_cast<uint32_t>(a.reason));
    t.aborted_on_node = a.node;
    t.state = v1::ABORTED;
    PublishMetrics(t);
  }
  return aborted;
}

void Watchdog::OnLeaseLost(const std::string& why) {
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    for (const groups::GroupSnapshot& g : groups->groups) {
      const v1::GroupLayout& layout = g.layout;
      if (!g.active || layout.nodes_size() < 2) continue;
      Tracked& t = Track(g);
      if (!t.abort_reason.empty()) continue;
      const std::string node = layout.this_node() >= 0 && layout.this_node() < layout.nodes_size()
                                   ? layout.nodes(layout.this_node()).node()
                                   : std::string("?");
      v1::Diagnosis d;
      d.set_kind(v1::DEAD);
      d.set_job_id(g.job_id);
      d.set_uid(g.uid);
      d.set_group(g.name);
      d.set_detected_unix_ms(static_cast<int64_t>(now_ns / 1000000));
      d.set_since_unix_ms(d.detected_unix_ms());
      d.set_summary(absl::StrCat("group ", g.name, ": this node (", node,
                                 ") lost its lease in etcd (", why,
                                 "); the group's other nodes count it as gone"));
      t.acted_key = "lease_lost";
      t.last = d;
      t.state = v1::ABORTED;
      Act(t, d, deferred,
          {.trigger = "lease_lost", .dump = {.local_only = true}, .announce = false});
      PublishMetrics(t);
    }
  }
  for (auto& f : deferred) f();
}

void Watchdog::OnRankDeath(const groups::RankDeath& death) {
  const groups::GroupSnapshot& g = death.group;
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    Tracked& t = Track(g);
    GroupView view;
    view.job_id = g.job_id;
    view.uid = g.uid;
    view.group = g.name;
    bool aborted = !t.abort_reason.empty();
    for (size_t r = 0; r < g.members.size(); ++r) {
      ReadRank(g.members[r], t.ranks[r], now_ns, g);
      view.ranks.push_back(t.ranks[r].last);
      aborted = aborted || t.ranks[r].abort_reason != 0;
    }
    if (aborted) {
      // Its survivors were stopped already (an earlier death, a finding, an operator), and
      // under TERMINATE this death may be the watchdog's own doing: the finding and the dump
      // that stopped the group stay the ones that explain it.
      COMMD_LOG(WARNING, "watchdog")
          << g.job_id << "/" << g.name << ": " << death.text << " (group already aborted)";
      return;
    }
    view.frontier_seq = FrontierSeq(view);
    const v1::Diagnosis d =
        DeathDiagnosis(view, death.rank, absl::StrCat("group ", g.name, ": ", death.text), now_ns);
    // The polls after this one see the same death as a `dead` finding: already acted upon.
    t.acted_key = absl::StrCat(d.kind(), ":", d.seq());
    t.last = d;
    t.state = v1::ABORTED;
    Act(t, d, deferred, {.death = &death});
    PublishMetrics(t);
  }
  for (auto& f : deferred) f();
}

void Watchdog::PublishMetrics(const Tracked& t) {
  GroupMetrics::Live live{.job = t.info.job_id, .group = t.info.name, .state = t.state};
  for (size_t r = 0; r < t.info.members.size(); ++r) {
    live.blocks.push_back(t.info.members[r].block);
    live.progress_ns.push_back(r < t.ranks.size() ? t.ranks[r].progress_ns : 0);
  }
  group_metrics_->Update(t.info.id, std::move(live));
}

void Watchdog::Forget(Tracked& t) {
  group_metrics_->Retire(t.info.id);  // its own series only: others may share its names
  t.retired = true;
  t.ranks.clear();
  t.info.members.clear();  // drops the mappings
  retired_.push_back(std::move(t));
  if (retired_.size() > kRetiredKept) retired_.erase(retired_.begin());
}

void Watchdog::PollOnce() {
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    std::set<uint64_t> seen;
    for (const groups::GroupSnapshot& g : groups->groups) {
      if (!g.active) continue;
      seen.insert(g.id);
      Tracked& t = tracked_[g.id];
      t.info = g;
      PollGroup(t, now_ns, deferred);
    }
    for (auto it = tracked_.begin(); it != tracked_.end();) {
      if (seen.contains(it->first)) {
        ++it;
        continue;
      }
      // A last read: the collectives its ranks completed just before leaving still count
      // (their durations here, their counters when GroupMetrics retires the group).
      Tracked& gone = it->second;
      for (size_t r = 0; r < gone.info.members.size() && r < gone.ranks.size(); ++r) {
        ReadRank(gone.info.members[r], gone.ranks[r], now_ns, gone.info);
      }
      if (options_.progress != nullptr && !gone.published.empty()) {
        deferred.push_back([sink = options_.progress, uid = gone.info.uid, job = gone.info.job_id,
                            name = gone.info.name] { sink->Remove(uid, job, name); });
      }
      Forget(gone);
      it = tracked_.erase(it);
    }
    signals_.KillDue(absl::Now());
  }
  for (auto& f : deferred) f();
}

v1::GroupHealth Watchdog::HealthOf(const Tracked& t) const {
  v1::GroupHealth h;
  h.set_job_id(t.info.job_id);
  h.set_uid(t.info.uid);
  h.set_group(t.info.name);
  h.set_description(t.info.description);
  h.set_state(t.state);
  h.set_policy(PolicyOf(t.info));
  if (t.last) *h.mutable_last_diagnosis() = *t.last;
  h.set_abort_reason(t.abort_reason);
  h.set_aborted_on_node(t.aborted_on_node);
  h.set_timeout_ms(absl::ToInt64Milliseconds(TimeoutOf(t.info)));
  return h;
}

void Watchdog::PublishProgress(Tracked& t, uint64_t now_ns, Deferred& deferred) {
  if (options_.progress == nullptr) return;
  // What a view says, without building it: state, finding, abort, each rank's progress.
  std::string key =
      absl::StrCat(t.state, "|", t.acted_key, "|", t.job_view_gen, "|", t.abort_reason);
  for (const RankCursor& c : t.ranks) {
    absl::StrAppend(&key, "|", static_cast<int>(c.last.liveness), ",", c.last.enqueued, ",",
                    c.last.started, ",", c.last.completed);
  }
  const uint64_t period = static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.progress_period));
  if (key == t.published || (t.published_ns != 0 && now_ns - t.published_ns < period)) return;
  t.published = std::move(key);
  t.published_ns = now_ns;
  v1::NodeGroupView view;
  *view.mutable_health() = HealthOf(t);
  for (const RankCursor& c : t.ranks) FillRankProgress(c.last, now_ns, view.add_ranks());
  view.set_published_unix_ms(static_cast<int64_t>(now_ns / 1000000));
  deferred.push_back([sink = options_.progress, view = std::move(view)]() mutable {
    sink->Publish(std::move(view));
  });
}

std::vector<v1::GroupHealth> Watchdog::Health(const groups::GroupSelector& filter) const {
  std::vector<v1::GroupHealth> out;
  absl::MutexLock lock(&mu_);
  auto add = [&](const Tracked& t) {
    if (filter.Selects(t.info)) out.push_back(HealthOf(t));
  };
  for (const auto& [id, t] : tracked_) add(t);
  // Groups that are gone, newest first, unless a live group of the same name is listed.
  for (auto it = retired_.rbegin(); it != retired_.rend(); ++it) {
    bool shadowed = false;
    for (const auto& h : out) {
      shadowed = shadowed || (h.job_id() == it->info.job_id && h.uid() == it->info.uid &&
                              h.group() == it->info.name);
    }
    // A group that ended without a finding is of no more interest.
    if (!shadowed && (it->last.has_value() || !it->abort_reason.empty())) add(*it);
  }
  return out;
}

absl::StatusOr<int> Watchdog::Abort(const groups::GroupSelector& filter,
                                    const std::string& reason) {
  int notified = 0;
  int matched = 0;
  const std::shared_ptr<const groups::GroupsSnapshot> groups = groups_->Snapshot();
  for (const groups::GroupSnapshot* g : groups::Select(*groups, filter, /*active_only=*/true)) {
    ++matched;
    bool first = false;
    notified += signals_.Notify(*g, AbortReason::kAdmin, reason, &first);
    groups_->Abort(g->id, absl::StrCat("on request: ", reason));
    if (first) Announce(*g, AbortReason::kAdmin, reason);
    // An abort is a moment worth a dump too: what every rank was doing when it was stopped.
    (void)dumps_->DumpGroups(
        *g, "abort", nlohmann::json{{"kind", "ABORT"}, {"group", g->name}, {"summary", reason}});
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(g->id);
    if (it != tracked_.end()) {
      it->second.abort_reason = "admin";
      it->second.state = v1::ABORTED;
      group_metrics_->SetState(g->id, v1::ABORTED);
    }
  }
  if (matched == 0) {
    return absl::NotFoundError(
        absl::StrCat("no formed group",
                     filter.group.empty() ? "" : " " + QuoteForError(filter.group), " to abort"));
  }
  return notified;
}

void Watchdog::OnRendezvousTimeout(const groups::GroupSnapshot& g, const std::vector<int>& joined,
                                   const std::vector<int>& missing) {
  const uint64_t now = clock_->NowNs();
  v1::Diagnosis d = RendezvousDiagnosis(g.job_id, g.uid, g.name, joined, missing,
                                        static_cast<uint64_t>(absl::ToUnixNanos(g.created)), now);
  group_metrics_->CountHang(g.job_id, g.name, "rendezvous");
  COMMD_LOG(WARNING, "watchdog") << g.job_id << "/" << g.name << ": rendezvous: " << d.summary();
  absl::MutexLock lock(&mu_);
  Tracked t;
  t.info = g;
  t.info.members.clear();
  t.state = v1::HUNG;
  t.last = std::move(d);
  t.retired = true;
  retired_.push_back(std::move(t));
  if (retired_.size() > kRetiredKept) retired_.erase(retired_.begin());
}

}  // namespace commd::watchdog
