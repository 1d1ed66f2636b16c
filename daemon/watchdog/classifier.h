// The watchdog's judgement: from what every rank of a group shows (progress words, recent
// flight-recorder entries, heartbeat, whether its process lives) to a diagnosis, or none.
//
//   GroupView view = ...;                 // filled by the poller (or a test)
//   tracker.Observe(&view, now_ns);       // stamps since-when times the judgement needs
//   std::optional<v1::Diagnosis> d = Classify(view, {.timeout_ns = ..., ...}, now_ns);
//
// Classify is a pure function of its arguments: no clock, no shared memory, no I/O, so every
// kind is unit-tested with made-up views and a fake `now`. Definitions (DESIGN.md):
//   dead          a rank's process is gone (or it left) while it held work or others wait on it;
//   mismatch      ranks that entered the same collective seq disagree on op, sizes or dtypes;
//   unresponsive  a rank holds unfinished work and its heartbeat is older than the heartbeat
//                 timeout while another rank's is fresh;
//   lagging       after the timeout, some ranks entered seq N and others (the laggards) did not;
//   stuck         after the timeout, every rank entered seq N and some did not finish it.
// A group with nothing pending (a long compute gap) is never a finding, however long.
//
// Thread-safety: Classify is thread-safe; a GroupTracker belongs to one poller thread.
#ifndef COMMD_DAEMON_WATCHDOG_CLASSIFIER_H_
#define COMMD_DAEMON_WATCHDOG_CLASSIFIER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "commd/v1/health.pb.h"
#include "common/control_block.h"

namespace commd::watchdog {

enum class Liveness {
  kAlive,
  kDead,  // its process exited with its session open (pidfd)
  kLeft,  // it closed its session while its process lives on
};

// What a rank recorded for one collective seq: the first entry with that seq (coalesced
// members share a seq; the first is enough to compare).
struct EntryView {
  CollectiveOp op = CollectiveOp::kAllReduce;
  std::vector<std::vector<int64_t>> input_sizes;
  std::vector<DataType> input_dtypes;
  RecordState state = RecordState::kScheduled;
};

struct RankView {
  int rank = 0;
  int global_rank = 0;
  int64_t pid = 0;
  Liveness liveness = Liveness::kAlive;
  bool readable = true;  // the control block could be read (else progress words are stale)
  uint64_t enqueued = 0;
  uint64_t started = 0;
  uint64_t completed = 0;
  uint64_t heartbeat_ns = 0;  // as the rank wrote it (its clock); 0: never
  // Daemon clock when the rank's heartbeat or progress last changed (GroupTracker fills it).
  uint64_t alive_seen_ns = 0;
  std::map<uint64_t, EntryView> entries;  // recent entries by collective seq
};

// `r`'s identity, liveness and progress into `out` (heartbeat age against `now_ns`).
void FillRankProgress(const RankView& r, uint64_t now_ns, v1::RankView* out);

struct GroupView {
  std::string job_id;
  uint32_t uid = 0;
  std::string group;
  std::vector<RankView> ranks;  // by rank
  // The oldest collective not completed everywhere, and since when (daemon clock) some rank
  // has been in it; pending_since_ns is 0 while no rank has entered it. GroupTracker fills both.
  uint64_t frontier_seq = 1;
  uint64_t pending_since_ns = 0;
};

struct Thresholds {
  uint64_t timeout_ns = 0;            // the group's collective timeout
  uint64_t heartbeat_timeout_ns = 0;  // watchdog.heartbeat_timeout_ms
};

// The oldest collective seq some rank has not completed (min completed + 1).
uint64_t FrontierSeq(const GroupView& view);

// Remembers, across polls of one group, since when each rank has shown no change and since
// when the frontier collective has been pending; writes both into the view.
class GroupTracker {
 public:
  void Observe(GroupView* view, uint64_t now_ns);

 private:
  struct Seen {
    uint64_t heartbeat_ns = 0, enqueued = 0, started = 0, completed = 0;
    uint64_t changed_ns = 0;
  };
  std::vector<Seen> ranks_;
  uint64_t frontier_ = 0;
  uint64_t pending_since_ns_ = 0;
};

// The finding for `view` at `now_ns`, or none. Ranks in the diagnosis are group ranks.
std::optional<v1::Diagnosis> Classify(const GroupView& view, const Thresholds& thresholds,
                                      uint64_t now_ns);

// A group whose rendezvous never completed: `missing` never joined within `timeout`.
v1::Diagnosis RendezvousDiagnosis(const std::string& job_id, uint32_t uid, const std::string& group,
                                  const std::vector<int>& joined, const std::vector<int>& missing,
                                  uint64_t since_ns, uint64_t now_ns);

// A member whose process exited (groups::RankDeath): certain, so a finding whatever the others
// do. `rank` is behind at its completed seq + 1; `summary` says who and how it ended.
v1::Diagnosis DeathDiagnosis(const GroupView& view, int rank, const std::string& summary,
                             uint64_t now_ns);

// "HEALTHY", "SUSPECT" (work pending past half the timeout) or nothing to say beyond Classify.
bool IsSuspect(const GroupView& view, const Thresholds& thresholds, uint64_t now_ns);

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_CLASSIFIER_H_
