#include "daemon/watchdog/watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/control_block_admin.h"
#include "common/log.h"
#include "common/names.h"
#include "daemon/metrics/histograms.h"
#include "daemon/recorder/ring_reader.h"

namespace commd::watchdog {

namespace {

constexpr size_t kRetiredKept = 64;

}  // namespace

Watchdog::Watchdog(WatchdogOptions options, groups::GroupRegistry* groups,
                   recorder::GroupDumps* dumps, PushEvent push, prometheus::Registry* registry,
                   std::unique_ptr<RecorderClock> clock)
    : options_(options),
      groups_(groups),
      dumps_(dumps),
      clock_(std::move(clock)),
      signals_(std::move(push), clock_.get(), group_metrics_.get(), options.terminate_grace),
      findings_(
          {.views = options.progress,
           .aborts = options.aborts,
           .job_view_wait = options.job_view_wait},
          groups, dumps, &signals_,
          [this](uint64_t group_id, const std::string& acted_key, const std::string& summary) {
            absl::MutexLock lock(&mu_);
            SetJobSummary(group_id, acted_key, summary);
          }),
      poll_seconds_(&metrics::AddHistogram(*registry, "commd_watchdog_poll_duration_seconds",
                                           "Time one watchdog poll of every group takes",
                                           metrics::GeometricBuckets(1e-6, 4, 10))) {}

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
  findings_.ExpireJobViews(absl::InfiniteFuture());
}

void Watchdog::Run() {
  absl::Time next = absl::Now() + options_.poll_interval;
  for (;;) {
    {
      // Also woken at the deadline of a finding that waits for the nodes' views, whatever the
      // poll interval.
      const absl::Time wake = std::min(next, findings_.NextJobViewDeadline());
      absl::MutexLock lock(&run_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_) { return stopping_; };
      if (run_mu_.AwaitWithDeadline(absl::Condition(&stop), wake)) return;
    }
    const absl::Time start = absl::Now();
    findings_.ExpireJobViews(start);
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

GroupView Watchdog::ReadGroup(Tracked& t, uint64_t now_ns, bool* aborted) {
  const groups::GroupSnapshot& g = t.info;
  GroupView view{.job_id = g.job_id, .uid = g.uid, .group = g.name};
  *aborted = false;
  for (size_t r = 0; r < g.members.size(); ++r) {
    ReadRank(g.members[r], t.ranks[r], now_ns, g);
    view.ranks.push_back(t.ranks[r].last);
    *aborted = *aborted || t.ranks[r].abort_reason != 0;
  }
  return view;
}

void Watchdog::PollGroup(Tracked& t, uint64_t now_ns, Deferred& deferred) {
  const groups::GroupSnapshot& g = t.info;
  bool aborted = false;
  GroupView view = ReadGroup(t, now_ns, &aborted);
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

void Watchdog::Act(Tracked& t, const v1::Diagnosis& d, Deferred& deferred, const Cause& cause) {
  const groups::GroupSnapshot& g = t.info;
  group_metrics_->CountHang(g.job_id, g.name, KindLabel(d.kind()));
  Finding f = DecideFinding(g, d, PolicyOf(g), cause);
  if (f.abort) t.abort_reason = AbortReasonName(static_cast<uint32_t>(ReasonOf(d.kind())));
  // Only a suspicion on a group spanning nodes asks the other nodes who holds it back: a fact
  // (a death, a node or lease lost) names its cause already.
  if (!IsFact(cause) && options_.progress != nullptr && g.layout.nodes_size() >= 2) {
    if (std::optional<std::string> refused =
            findings_.WaitForJobView(std::move(f), t.acted_key, deferred)) {
      SetJobSummary(g.id, t.acted_key, *refused);
    }
    return;
  }
  deferred.push_back([this, f = std::move(f)] { findings_.Carry(f); });
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

Watchdog::Tracked& Watchdog::Track(const groups::GroupSnapshot& g) {
  Tracked& t = tracked_[g.id];
  t.info = g;
  if (t.ranks.size() != g.members.size()) t.ranks.resize(g.members.size());
  return t;
}

void Watchdog::ActOnFacts(std::vector<ClusterFact> facts) {
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    for (ClusterFact& fact : facts) {
      Tracked& t = Track(fact.group);
      if (!t.abort_reason.empty()) continue;
      v1::Diagnosis& d = fact.diagnosis;
      d.set_detected_unix_ms(static_cast<int64_t>(now_ns / 1000000));
      d.set_since_unix_ms(d.detected_unix_ms());
      t.acted_key = fact.key;
      t.last = d;
      t.state = v1::ABORTED;
      Act(t, d, deferred,
          {.trigger = fact.trigger, .dump = std::move(fact.dump), .announce = false});
      PublishMetrics(t);
    }
  }
  for (auto& f : deferred) f();
}

bool Watchdog::AbortForNode(const groups::GroupSnapshot& g, AbortReason reason,
                            const std::string& text, const std::string& node) {
  bool first = false;
  signals_.Notify(g, reason, text, &first);
  if (!first) return false;  // aborted here already: its own cause and dump stand
  groups_->Abort(g.id, text);
  absl::MutexLock lock(&mu_);
  Tracked& t = Track(g);
  t.abort_reason = AbortReasonName(static_cast<uint32_t>(reason));
  t.aborted_on_node = node;
  t.state = v1::ABORTED;
  PublishMetrics(t);
  return true;
}

void Watchdog::OnRankDeath(const groups::RankDeath& death) {
  const groups::GroupSnapshot& g = death.group;
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    Tracked& t = Track(g);
    bool aborted = false;
    GroupView view = ReadGroup(t, now_ns, &aborted);
    if (aborted || !t.abort_reason.empty()) {
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
  Retire(std::move(t));
}

void Watchdog::Retire(Tracked t) {
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
      PollGroup(Track(g), now_ns, deferred);
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
    if (first) findings_.Announce(*g, AbortReason::kAdmin, reason);
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
  Retire(std::move(t));
}

}  // namespace commd::watchdog
