#include "daemon/watchdog/ring_cursor.h"

#include <optional>

namespace commd::watchdog {

namespace {

// Ring entries read per rank and poll at most (the newest): bounds the poll's cost when ranks
// record faster than it polls. 8 per 100 ms is 80 collectives/s per rank seen in full.
constexpr uint32_t kEntriesPerPoll = 8;
// An entry left open (neither completed nor retired) this many records ago never will be.
constexpr uint64_t kStaleOpenRecords = 4096;
constexpr size_t kEntriesKept = 64;

}  // namespace

std::vector<GroupMetrics::Duration> RankCursor::Read(const groups::MemberSnapshot& m,
                                                     uint64_t now_ns) {
  RankView& v = last;
  v.rank = m.rank;
  v.global_rank = m.global_rank;
  v.pid = m.pid;
  v.liveness = !m.gone ? Liveness::kAlive : m.died ? Liveness::kDead : Liveness::kLeft;
  v.readable = false;
  if (m.block == nullptr) return {};
  auto snap = ReadControlBlock(m.block->data(), m.block->size(),
                               {.from_record_id = next_record_, .max_entries = kEntriesPerPoll});
  if (!snap.ok()) return {};  // keeps the last good view; the header was scribbled on
  (void)StampDiscoveries(m.block->data(), m.block->size(), now_ns, &*snap);
  v.readable = true;
  v.enqueued = snap->last_enqueued_seq;
  v.started = snap->last_started_seq;
  v.completed = snap->last_completed_seq;
  v.heartbeat_ns = snap->heartbeat_ns;
  abort_reason = snap->abort_reason;
  if (v.completed != completed_seen_ || progress_ns == 0) {
    completed_seen_ = v.completed;
    progress_ns = now_ns;
  }
  return Observe(*snap);
}

std::vector<GroupMetrics::Duration> RankCursor::Observe(const RingSnapshot& snap) {
  // Entries seen complete for the first time: a sample of the durations when the rank
  // recorded more than kEntriesPerPoll since the last poll, the whole of them otherwise.
  // (Counts and bytes come exact from the control block's counters: GroupMetrics.)
  std::vector<GroupMetrics::Duration> durations;
  std::optional<uint64_t> first_open;
  for (const RecordedEntry& e : snap.entries) {
    if (e.record_id < next_record_) continue;
    if (!e.is_p2p && e.collective_seq_id != 0) {
      auto [it, fresh] = entries.try_emplace(e.collective_seq_id);
      if (fresh) it->second = {e.op, e.input_sizes, e.input_dtypes, e.state};
      if (it->second.op == e.op) it->second.state = e.state;
    }
    const bool done = e.state == RecordState::kCompleted;
    if (done && counted_.insert(e.record_id).second && e.duration_ms.has_value() &&
        *e.duration_ms >= 0) {
      durations.push_back({static_cast<uint32_t>(e.op), *e.duration_ms / 1e3});
    }
    if (!done && !e.retired && !first_open) first_open = e.record_id;
  }
  // The cursor: the oldest record still open, unless it is so old that it never will close.
  uint64_t next = first_open.value_or(snap.next_record_id);
  if (snap.next_record_id > next + kStaleOpenRecords) next = snap.next_record_id;
  if (next > next_record_) next_record_ = next;
  counted_.erase(counted_.begin(), counted_.lower_bound(next_record_));
  while (counted_.size() > kStaleOpenRecords) counted_.erase(counted_.begin());
  while (entries.size() > kEntriesKept) entries.erase(entries.begin());
  return durations;
}

}  // namespace commd::watchdog
