#include "daemon/watchdog/classifier.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace commd::watchdog {

namespace {

constexpr uint64_t kNsPerMs = 1000000;

const char* LivenessName(Liveness l) {
  switch (l) {
    case Liveness::kDead:
      return "dead";
    case Liveness::kLeft:
      return "left";
    default:
      return "alive";
  }
}

std::string SizesText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

bool SameCall(const EntryView& a, const EntryView& b) {
  return a.op == b.op && a.input_sizes == b.input_sizes && a.input_dtypes == b.input_dtypes;
}

std::string RanksText(const google::protobuf::RepeatedField<int32_t>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

}  // namespace

void FillRankProgress(const RankView& r, uint64_t now_ns, v1::RankView* out) {
  out->set_rank(r.rank);
  out->set_global_rank(r.global_rank);
  out->set_pid(r.pid);
  out->set_liveness(LivenessName(r.liveness));
  out->set_last_enqueued_seq(r.enqueued);
  out->set_last_started_seq(r.started);
  out->set_last_completed_seq(r.completed);
  out->set_heartbeat_age_ms(r.alive_seen_ns == 0 || r.alive_seen_ns > now_ns
                                ? (r.alive_seen_ns == 0 ? -1 : 0)
                                : static_cast<int64_t>((now_ns - r.alive_seen_ns) / kNsPerMs));
}

namespace {

// The skeleton every finding shares: who the group is, and each rank as seen at `seq`.
v1::Diagnosis Base(const GroupView& view, v1::DiagnosisKind kind, uint64_t seq, uint64_t now_ns) {
  v1::Diagnosis d;
  d.set_kind(kind);
  d.set_job_id(view.job_id);
  d.set_uid(view.uid);
  d.set_group(view.group);
  d.set_seq(seq);
  d.set_detected_unix_ms(static_cast<int64_t>(now_ns / kNsPerMs));
  for (const RankView& r : view.ranks) {
    v1::RankView* out = d.add_ranks();
    FillRankProgress(r, now_ns, out);
    auto it = r.entries.find(seq);
    if (it == r.entries.end()) continue;
    const EntryView& e = it->second;
    out->set_op(CollectiveName(e.op));
    for (const auto& dims : e.input_sizes) out->add_input_sizes(SizesText(dims));
    for (DataType t : e.input_dtypes) {
      const char* name = DataTypeInfo(t).scalar;
      out->add_input_dtypes(name != nullptr ? name : "?");
    }
    out->set_state(RecordStateName(static_cast<uint32_t>(e.state)));
  }
  return d;
}

uint64_t MaxEnqueued(const GroupView& view, bool alive_only) {
  uint64_t m = 0;
  for (const RankView& r : view.ranks) {
    if (!alive_only || r.liveness == Liveness::kAlive) m = std::max(m, r.enqueued);
  }
  return m;
}

// A rank gone while it held work, or while a live rank has entered a collective it never
// completed (it will never join in).
std::optional<v1::Diagnosis> FindDead(const GroupView& view, uint64_t now_ns) {
  const uint64_t live_max = MaxEnqueued(view, /*alive_only=*/true);
  std::vector<int> dead;
  for (const RankView& r : view.ranks) {
    if (r.liveness == Liveness::kAlive) continue;
    const bool held_work = r.enqueued > r.completed;
    if (held_work || live_max > r.completed) dead.push_back(r.rank);
  }
  if (dead.empty()) return std::nullopt;
  const uint64_t seq = view.ranks[dead[0]].completed + 1;
  v1::Diagnosis d = Base(view, v1::DEAD, seq, now_ns);
  for (int r : dead) {
    d.add_ranks_dead(r);
    d.add_ranks_behind(r);
  }
  for (const RankView& r : view.ranks) {
    if (r.liveness == Liveness::kAlive && r.enqueued >= seq) d.add_ranks_ahead(r.rank);
  }
  d.set_since_unix_ms(view.pending_since_ns != 0 ? view.pending_since_ns / kNsPerMs
                                                 : now_ns / kNsPerMs);
  d.set_summary(absl::StrCat("group ", view.group, ": rank(s) ", RanksText(d.ranks_dead()),
                             " gone (", LivenessName(view.ranks[dead[0]].liveness),
                             ") while collective seq ", seq, " needs them"));
  return d;
}

}  // namespace

v1::Diagnosis DeathDiagnosis(const GroupView& view, int rank, const std::string& summary,
                             uint64_t now_ns) {
  const uint64_t seq = rank >= 0 && static_cast<size_t>(rank) < view.ranks.size()
                           ? view.ranks[rank].completed + 1
                           : view.frontier_seq;
  v1::Diagnosis d = Base(view, v1::DEAD, seq, now_ns);
  d.add_ranks_dead(rank);
  d.add_ranks_behind(rank);
  for (const RankView& r : view.ranks) {
    if (r.liveness == Liveness::kAlive && r.enqueued >= seq) d.add_ranks_ahead(r.rank);
  }
  d.set_since_unix_ms(now_ns / kNsPerMs);
  d.set_summary(summary);
  return d;
}

namespace {

// Ranks that entered the same seq and disagree about it; looks at the oldest seqs first.
std::optional<v1::Diagnosis> FindMismatch(const GroupView& view, uint64_t now_ns) {
  const uint64_t last = MaxEnqueued(view, false);
  for (uint64_t seq = view.frontier_seq; seq <= last && seq < view.frontier_seq + 8; ++seq) {
    const EntryView* first = nullptr;
    int first_rank = -1;
    std::vector<int> differ;
    for (const RankView& r : view.ranks) {
      auto it = r.entries.find(seq);
      if (it == r.entries.end()) continue;
      if (first == nullptr) {
        first = &it->second;
        first_rank = r.rank;
      } else if (!SameCall(*first, it->second)) {
        differ.push_back(r.rank);
      }
    }
    if (differ.empty()) continue;
    v1::Diagnosis d = Base(view, v1::MISMATCH, seq, now_ns);
    // The minority is "behind": with two camps, the ranks unlike the first one seen.
    std::vector<int> same;
    for (const RankView& r : view.ranks) {
      auto it = r.entries.find(seq);
      if (it != r.entries.end() && SameCall(*first, it->second)) same.push_back(r.rank);
    }
    const bool first_is_minority = same.size() < differ.size();
    for (int r : first_is_minority ? same : differ) d.add_ranks_behind(r);
    for (int r : first_is_minority ? differ : same) d.add_ranks_ahead(r);
    d.set_since_unix_ms(view.pending_since_ns != 0 ? view.pending_since_ns / kNsPerMs
                                                   : now_ns / kNsPerMs);
    d.set_summary(absl::StrCat("group ", view.group, ": collective seq ", seq,
                               " differs across ranks: rank(s) ", RanksText(d.ranks_behind()),
                               " disagree with rank ", first_is_minority ? differ[0] : first_rank,
                               " on op, sizes or dtypes"));
    return d;
  }
  return std::nullopt;
}

// A rank holding work whose heartbeat went stale while a peer's stayed fresh.
std::optional<v1::Diagnosis> FindUnresponsive(const GroupView& view, const Thresholds& t,
                                              uint64_t now_ns) {
  if (t.heartbeat_timeout_ns == 0) return std::nullopt;
  auto stale = [&](const RankView& r) {
    return r.alive_seen_ns != 0 && now_ns > r.alive_seen_ns &&
           now_ns - r.alive_seen_ns > t.heartbeat_timeout_ns;
  };
  std::vector<int> silent;
  bool peer_fresh = false;
  for (const RankView& r : view.ranks) {
    if (r.liveness != Liveness::kAlive || !r.readable) continue;
    if (r.enqueued > r.completed && stale(r)) {
      silent.push_back(r.rank);
    } else if (!stale(r)) {
      peer_fresh = true;
    }
  }
  if (silent.empty() || !peer_fresh) return std::nullopt;
  const uint64_t seq = view.ranks[silent[0]].completed + 1;
  v1::Diagnosis d = Base(view, v1::UNRESPONSIVE, seq, now_ns);
  for (int r : silent) d.add_ranks_behind(r);
  for (const RankView& r : view.ranks) {
    if (std::find(silent.begin(), silent.end(), r.rank) == silent.end()) d.add_ranks_ahead(r.rank);
  }
  d.set_since_unix_ms(view.ranks[silent[0]].alive_seen_ns / kNsPerMs);
  d.set_summary(absl::StrCat("group ", view.group, ": rank(s) ", RanksText(d.ranks_behind()),
                             " stopped heartbeating while holding collective seq ", seq));
  return d;
}

// After the timeout: who has not entered the frontier collective, or not finished it.
std::optional<v1::Diagnosis> FindHang(const GroupView& view, const Thresholds& t, uint64_t now_ns) {
  const uint64_t seq = view.frontier_seq;
  if (view.pending_since_ns == 0 || now_ns < view.pending_since_ns ||
      now_ns - view.pending_since_ns < t.timeout_ns) {
    return std::nullopt;
  }
  std::vector<int> not_entered, entered, not_started, not_done, done;
  for (const RankView& r : view.ranks) {
    (r.enqueued >= seq ? entered : not_entered).push_back(r.rank);
    if (r.started < seq) not_started.push_back(r.rank);
    (r.completed >= seq ? done : not_done).push_back(r.rank);
  }
  if (entered.empty()) return std::nullopt;
  v1::Diagnosis d;
  if (!not_entered.empty()) {
    d = Base(view, v1::LAGGING, seq, now_ns);
    for (int r : not_entered) d.add_ranks_behind(r);
    for (int r : entered) d.add_ranks_ahead(r);
    d.set_summary(absl::StrCat("group ", view.group, ": rank(s) ", RanksText(d.ranks_behind()),
                               " never entered collective seq ", seq, " that rank(s) ",
                               RanksText(d.ranks_ahead()), " wait in"));
  } else {
    d = Base(view, v1::STUCK, seq, now_ns);
    const std::vector<int>& behind = not_started.empty() ? not_done : not_started;
    for (int r : behind) d.add_ranks_behind(r);
    for (const RankView& r : view.ranks) {
      if (std::find(behind.begin(), behind.end(), r.rank) == behind.end())
        d.add_ranks_ahead(r.rank);
    }
    d.set_summary(absl::StrCat(
        "group ", view.group, ": collective seq ", seq, " entered by every rank, not ",
        not_started.empty() ? "finished" : "started", " by rank(s) ", RanksText(d.ranks_behind())));
  }
  d.set_since_unix_ms(view.pending_since_ns / kNsPerMs);
  return d;
}

}  // namespace

uint64_t FrontierSeq(const GroupView& view) {
  uint64_t min_completed = std::numeric_limits<uint64_t>::max();
  for (const RankView& r : view.ranks) min_completed = std::min(min_completed, r.completed);
  return view.ranks.empty() ? 1 : min_completed + 1;
}

void GroupTracker::Observe(GroupView* view, uint64_t now_ns) {
  if (ranks_.size() != view->ranks.size()) ranks_.assign(view->ranks.size(), Seen{});
  for (size_t i = 0; i < view->ranks.size(); ++i) {
    RankView& r = view->ranks[i];
    Seen& s = ranks_[i];
    if (s.changed_ns == 0 || r.heartbeat_ns != s.heartbeat_ns || r.enqueued != s.enqueued ||
        r.started != s.started || r.completed != s.completed) {
      s = Seen{r.heartbeat_ns, r.enqueued, r.started, r.completed, now_ns};
    }
    r.alive_seen_ns = s.changed_ns;
  }
  const uint64_t frontier = FrontierSeq(*view);
  const bool entered = MaxEnqueued(*view, false) >= frontier;
  if (frontier != frontier_ || !entered) pending_since_ns_ = 0;
  frontier_ = frontier;
  if (entered && pending_since_ns_ == 0) pending_since_ns_ = now_ns;
  view->frontier_seq = frontier;
  view->pending_since_ns = pending_since_ns_;
}

std::optional<v1::Diagnosis> Classify(const GroupView& view, const Thresholds& thresholds,
                                      uint64_t now_ns) {
  if (view.ranks.empty()) return std::nullopt;
  if (auto d = FindDead(view, now_ns)) return d;
  if (auto d = FindMismatch(view, now_ns)) return d;
  if (auto d = FindUnresponsive(view, thresholds, now_ns)) return d;
  return FindHang(view, thresholds, now_ns);
}

bool IsSuspect(const GroupView& view, const Thresholds& thresholds, uint64_t now_ns) {
  return view.pending_since_ns != 0 && now_ns > view.pending_since_ns &&
         now_ns - view.pending_since_ns > thresholds.timeout_ns / 2;
}

v1::Diagnosis RendezvousDiagnosis(const std::string& job_id, uint32_t uid, const std::string& group,
                                  const std::vector<int>& joined, const std::vector<int>& missing,
                                  uint64_t since_ns, uint64_t now_ns) {
  v1::Diagnosis d;
  d.set_kind(v1::RENDEZVOUS);
  d.set_job_id(job_id);
  d.set_uid(uid);
  d.set_group(group);
  for (int r : missing) d.add_ranks_behind(r);
  for (int r : joined) d.add_ranks_ahead(r);
  d.set_since_unix_ms(static_cast<int64_t>(since_ns / kNsPerMs));
  d.set_detected_unix_ms(static_cast<int64_t>(now_ns / kNsPerMs));
  d.set_summary(absl::StrCat("group ", group, ": rank(s) ", RanksText(d.ranks_behind()),
                             " never joined; rendezvous did not complete"));
  return d;
}

}  // namespace commd::watchdog
