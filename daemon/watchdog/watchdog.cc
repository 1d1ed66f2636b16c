#include "daemon/watchdog/watchdog.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/control_block_admin.h"
#include "common/log.h"
#include "common/names.h"
#include "daemon/recorder/ring_reader.h"
#include "google/protobuf/util/json_util.h"

namespace commd::watchdog {

namespace {

constexpr size_t kRetiredKept = 64;
// Ring entries read per rank and poll at most (the newest): bounds the poll's cost when ranks
// record faster than it polls. 8 per 100 ms is 80 collectives/s per rank seen in full.
constexpr uint32_t kEntriesPerPoll = 8;
// An entry left open (neither completed nor retired) this many records ago never will be.
constexpr uint64_t kStaleOpenRecords = 4096;
constexpr size_t kEntriesKept = 64;

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

int PidfdOpen(int64_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSignal(int fd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0));
}

}  // namespace

Watchdog::Watchdog(WatchdogOptions options, groups::GroupRegistry* groups, recorder::Dumper* dumper,
                   PushEvent push, prometheus::Registry* registry,
                   std::unique_ptr<RecorderClock> clock)
    : options_(options),
      groups_(groups),
      dumper_(dumper),
      push_(std::move(push)),
      clock_(std::move(clock)) {
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
}

void Watchdog::Run() {
  absl::Time next = absl::Now();
  for (;;) {
    next += options_.poll_interval;
    {
      absl::MutexLock lock(&run_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_) { return stopping_; };
      if (run_mu_.AwaitWithDeadline(absl::Condition(&stop), next)) return;
    }
    const absl::Time start = absl::Now();
    PollOnce();
    const absl::Time end = absl::Now();
    poll_seconds_->Observe(absl::ToDoubleSeconds(end - start));
    if (next < end) next = end;  // a slow poll does not cause a burst of catch-up polls
  }
}

absl::Duration Watchdog::TimeoutOf(const groups::WatchedGroup& g) const {
  return std::min(g.timeout, options_.max_timeout);
}

v1::WatchdogPolicy Watchdog::PolicyOf(const groups::WatchedGroup& g) const {
  return g.policy == v1::WATCHDOG_POLICY_UNSPECIFIED ? options_.policy : g.policy;
}

void Watchdog::ReadRank(const groups::WatchedMember& m, RankCursor& c, uint64_t now_ns,
                        const groups::WatchedGroup& g) {
  RankView& v = c.last;
  v.rank = m.rank;
  v.global_rank = m.global_rank;
  v.pid = m.pid;
  v.liveness = !m.gone ? Liveness::kAlive : m.died ? Liveness::kDead : Liveness::kLeft;
  v.readable = false;
  if (m.block == nullptr) return;
  auto snap = ReadControlBlock(m.block->data(), m.block->size(),
                               {.from_record_id = c.next_record, .max_entries = kEntriesPerPoll});
  if (!snap.ok()) return;  // keeps the last good view; the header was scribbled on
  (void)StampDiscoveries(m.block->data(), m.block->size(), now_ns, &*snap);
  v.readable = true;
  v.enqueued = snap->last_enqueued_seq;
  v.started = snap->last_started_seq;
  v.completed = snap->last_completed_seq;
  v.heartbeat_ns = snap->heartbeat_ns;
  c.abort_reason = snap->abort_reason;
  if (v.completed != c.completed_seen || c.progress_ns == 0) {
    c.completed_seen = v.completed;
    c.progress_ns = now_ns;
  }
  ObserveEntries(*snap, c, g);
}

void Watchdog::ObserveEntries(const RingSnapshot& snap, RankCursor& c,
                              const groups::WatchedGroup& g) {
  // Entries seen complete for the first time: a sample of the durations when the rank
  // recorded more than kEntriesPerPoll since the last poll, the whole of them otherwise.
  // (Counts and bytes come exact from the control block's counters: GroupMetrics.)
  std::vector<GroupMetrics::Duration> durations;
  std::optional<uint64_t> first_open;
  for (const RecordedEntry& e : snap.entries) {
    if (e.record_id < c.next_record) continue;
    if (!e.is_p2p && e.collective_seq_id != 0) {
      auto [it, fresh] = c.entries.try_emplace(e.collective_seq_id);
      if (fresh) it->second = {e.op, e.input_sizes, e.input_dtypes, e.state};
      if (it->second.op == e.op) it->second.state = e.state;
    }
    const bool done = e.state == RecordState::kCompleted;
    if (done && c.counted.insert(e.record_id).second && e.duration_ms.has_value() &&
        *e.duration_ms >= 0) {
      durations.push_back({static_cast<uint32_t>(e.op), *e.duration_ms / 1e3});
    }
    if (!done && !e.retired && !first_open) first_open = e.record_id;
  }
  group_metrics_->ObserveDurations(g.job_id, g.name, durations);
  // The cursor: the oldest record still open, unless it is so old that it never will close.
  uint64_t next = first_open.value_or(snap.next_record_id);
  if (snap.next_record_id > next + kStaleOpenRecords) next = snap.next_record_id;
  if (next > c.next_record) c.next_record = next;
  c.counted.erase(c.counted.begin(), c.counted.lower_bound(c.next_record));
  while (c.counted.size() > kStaleOpenRecords) c.counted.erase(c.counted.begin());
  while (c.entries.size() > kEntriesKept) c.entries.erase(c.entries.begin());
}

void Watchdog::PollGroup(Tracked& t, uint64_t now_ns, Deferred& deferred) {
  const groups::WatchedGroup& g = t.info;
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
      Act(t, *d, deferred);
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
}

void Watchdog::Act(Tracked& t, const v1::Diagnosis& d, Deferred& deferred,
                   const groups::RankDeath* death) {
  const groups::WatchedGroup& g = t.info;
  const v1::WatchdogPolicy policy = PolicyOf(g);
  group_metrics_->CountHang(g.job_id, g.name, KindLabel(d.kind()));
  COMMD_LOG(WARNING, "watchdog") << g.job_id << "/" << g.name << ": " << KindLabel(d.kind()) << ": "
                                 << d.summary() << " (policy " << v1::WatchdogPolicy_Name(policy)
                                 << ")";
  if (death != nullptr) {
    // Its sources were taken as it died: the group may be gone from the registry by now.
    deferred.push_back([this, sources = death->sources, json = ToJson(d)]() mutable {
      if (!sources.empty()) dumper_->DumpLater("rank_death", std::move(sources), json);
    });
  } else {
    deferred.push_back([this, uid = g.uid, job = g.job_id, name = g.name, json = ToJson(d),
                        kind = KindLabel(d.kind())] {
      auto sources = groups_->DumpSources({.job = std::make_pair(uid, job), .group = name});
      if (!sources.empty()) {
        dumper_->DumpLater(absl::StrCat("hang-", kind), std::move(sources), json);
      }
    });
  }
  // A death is certain and the survivors can never complete with the dead rank: waiting out
  // their timeout would only hide what happened, so REPORT aborts it too.
  if (death != nullptr || policy == v1::NOTIFY || policy == v1::TERMINATE) {
    t.abort_reason = AbortReasonName(static_cast<uint32_t>(ReasonOf(d.kind())));
    deferred.push_back(
        [this, g, reason = ReasonOf(d.kind()), text = d.summary()] { Notify(g, reason, text); });
  }
  // After the dump has taken its sources: the group retires once every rank is gone.
  if (policy == v1::TERMINATE) {
    deferred.push_back([this, g] {
      absl::MutexLock lock(&mu_);
      Terminate(g);
    });
  }
}

void Watchdog::OnRankDeath(const groups::RankDeath& death) {
  const groups::WatchedGroup& g = death.group;
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    // The group may have formed since the last poll: it is tracked from here on.
    Tracked& t = tracked_[g.id];
    t.info = g;
    if (t.ranks.size() != g.members.size()) t.ranks.resize(g.members.size());
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
    Act(t, d, deferred, &death);
    PublishMetrics(t);
  }
  for (auto& f : deferred) f();
}

int Watchdog::Notify(const groups::WatchedGroup& g, AbortReason reason, const std::string& text) {
  const uint64_t now = clock_->NowNs();
  int notified = 0;
  bool first = false;
  for (const groups::WatchedMember& m : g.members) {
    if (m.block == nullptr) continue;
    first = RequestAbort(m.block->data(), m.block->size(), reason, text, now) || first;
    if (m.gone) continue;
    v1::SessionEvent event;
    event.mutable_abort_requested()->set_group(g.name);
    event.mutable_abort_requested()->set_reason(text);
    if (push_) push_(m.session_token, event);
    ++notified;
  }
  if (first) {
    group_metrics_->CountAbort(g.job_id, g.name, AbortReasonName(static_cast<uint32_t>(reason)));
  }
  COMMD_LOG(WARNING, "watchdog") << g.job_id << "/" << g.name << ": abort ("
                                 << AbortReasonName(static_cast<uint32_t>(reason)) << ") sent to "
                                 << notified << " rank(s): " << text;
  return notified;
}

void Watchdog::Terminate(const groups::WatchedGroup& g) {
  const absl::Time kill_at = absl::Now() + options_.terminate_grace;
  for (const groups::WatchedMember& m : g.members) {
    if (m.gone || m.pid <= 0) continue;
    UniqueFd fd(PidfdOpen(m.pid));
    if (fd.get() < 0) continue;  // already gone
    if (PidfdSignal(fd.get(), SIGTERM) != 0 && errno == ESRCH) continue;
    COMMD_LOG(WARNING, "watchdog")
        << g.job_id << "/" << g.name << ": SIGTERM to rank " << m.rank << " (pid " << m.pid << ")";
    kills_.push_back({std::move(fd), kill_at});
  }
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
  std::vector<groups::WatchedGroup> groups = groups_->Watch();
  const uint64_t now_ns = clock_->NowNs();
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    std::set<uint64_t> seen;
    for (groups::WatchedGroup& g : groups) {
      if (!g.active) continue;
      seen.insert(g.id);
      Tracked& t = tracked_[g.id];
      t.info = std::move(g);
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
      Forget(gone);
      it = tracked_.erase(it);
    }
    const absl::Time now = absl::Now();
    for (auto it = kills_.begin(); it != kills_.end();) {
      if (it->at > now) {
        ++it;
        continue;
      }
      PidfdSignal(it->pidfd.get(), SIGKILL);  // ESRCH: it went on its own
      it = kills_.erase(it);
    }
  }
  for (auto& f : deferred) f();
}

bool Watchdog::Selected(const HealthFilter& f, uid_t uid, const std::string& job,
                        const std::string& group) {
  if (f.job && (f.job->first != uid || f.job->second != job)) return false;
  if (f.job_any_uid && *f.job_any_uid != job) return false;
  return f.group.empty() || f.group == group;
}

std::vector<v1::GroupHealth> Watchdog::Health(const HealthFilter& filter) const {
  std::vector<v1::GroupHealth> out;
  absl::MutexLock lock(&mu_);
  auto add = [&](const Tracked& t) {
    if (!Selected(filter, t.info.uid, t.info.job_id, t.info.name)) return;
    v1::GroupHealth h;
    h.set_job_id(t.info.job_id);
    h.set_uid(t.info.uid);
    h.set_group(t.info.name);
    h.set_state(t.state);
    h.set_policy(PolicyOf(t.info));
    if (t.last) *h.mutable_last_diagnosis() = *t.last;
    h.set_abort_reason(t.abort_reason);
    h.set_timeout_ms(absl::ToInt64Milliseconds(TimeoutOf(t.info)));
    out.push_back(std::move(h));
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

absl::StatusOr<int> Watchdog::Abort(const HealthFilter& filter, const std::string& reason) {
  int notified = 0;
  int matched = 0;
  for (const groups::WatchedGroup& g : groups_->Watch()) {
    if (!g.active || !Selected(filter, g.uid, g.job_id, g.name)) continue;
    ++matched;
    notified += Notify(g, AbortReason::kAdmin, reason);
    // An abort is a moment worth a dump too: what every rank was doing when it was stopped.
    auto sources = groups_->DumpSources({.job = std::make_pair(g.uid, g.job_id), .group = g.name});
    if (!sources.empty()) {
      dumper_->DumpLater("abort", std::move(sources),
                         nlohmann::json{{"kind", "ABORT"}, {"group", g.name}, {"summary", reason}});
    }
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(g.id);
    if (it != tracked_.end()) {
      it->second.abort_reason = "admin";
      it->second.state = v1::ABORTED;
      group_metrics_->SetState(g.id, v1::ABORTED);
    }
  }
  if (matched == 0) {
    return absl::NotFoundError(
        absl::StrCat("no formed group",
                     filter.group.empty() ? "" : " " + QuoteForError(filter.group), " to abort"));
  }
  return notified;
}

void Watchdog::OnRendezvousTimeout(const groups::WatchedGroup& g, const std::vector<int>& joined,
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
