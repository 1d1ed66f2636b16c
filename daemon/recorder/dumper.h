// Writes flight-recorder dumps: one JSON file per rank (PyTorch's flight-recorder schema,
// version 2.10, plus a `commd` object), optionally a pickle beside each that torchfrtrace
// reads, in dump_dir/<job>/<dump id>/<group>/. The dump id is <UTC time>-<trigger> unless the
// caller names one: a dump of a job that spans nodes carries the id its first node minted, so
// that every node's files of it sit in directories of the same name (docs/cluster.md).
//
//   ASSIGN_OR_RETURN(DumpResult r, dumper.Dump("request", sources, std::nullopt));
//
// A dump reads shared memory only, so it works while a rank is stuck or after it died, and
// never waits on a client. Files are written under a temporary name and renamed, so a reader
// never sees half a file; a dump never overwrites an earlier one. Thread-safe.
#ifndef COMMD_DAEMON_RECORDER_DUMPER_H_
#define COMMD_DAEMON_RECORDER_DUMPER_H_

#include <sys/types.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "common/shm_mapping.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace commd::recorder {

// One rank's control block, as the group registry knows it.
struct DumpSource {
  std::string job_id;
  uid_t uid = 0;
  std::string group;
  std::string group_description;  // the process group's desc in the dump
  uint64_t group_id = 0;
  int rank = 0;
  int global_rank = 0;
  int world_size = 0;
  int64_t pid = 0;
  std::string device;
  std::vector<int> group_global_ranks;         // by group rank
  std::shared_ptr<const SharedMapping> block;  // kept mapped while the dump reads it
};

struct DumpResult {
  std::string dump_id;                   // when the caller named it, or the dump was announced
  bool announced = false;                // announced to the job's other nodes (GroupDumps)
  std::vector<std::string> directories;  // one per job dumped
  std::vector<std::string> files;
  uint64_t entries = 0;
  uint64_t invalid_entries = 0;
};

struct DumperOptions {
  std::string dump_dir;
  std::string host;
  std::string version;
  bool write_torch_pickle = false;
  // limits.per_uid: each uid's dump rate (a token bucket) and the bytes of its dumps kept.
  uint32_t dumps_per_minute = 12;
  uint32_t dump_burst = 32;
  uint64_t dump_bytes_per_uid = uint64_t{2} << 30;
};

// A dump's id, which names its directory: <UTC time to the ms>-<trigger>, then -<node> when
// the dump spans nodes; at most kMaxDumpIdBytes of a job id's alphabet (common/names.h). Two
// dumps in the same millisecond get the same id: callers that need distinct ones tell them
// apart. Not pure (reads the clock).
inline constexpr size_t kMaxDumpIdBytes = kMaxJobIdBytes;
std::string NewDumpId(const std::string& trigger, const std::string& node);
// `text` as a dump id: a job id's alphabet (others become '_'), at most kMaxDumpIdBytes. For
// ids every node derives alike from what they all see (a finding on a group spanning them).
std::string DumpIdOf(std::string text);

// dump_dir when the config names none: $STATE_DIRECTORY/dumps under systemd, else
// /var/lib/commd/dumps as root, else $XDG_STATE_HOME (or ~/.local/state)/commd/dumps.
std::string DefaultDumpDir();

class Dumper {
 public:
  Dumper(DumperOptions options, prometheus::Registry* registry);

  ~Dumper();  // finishes the queued dumps

  // `dump_id` empty: the dumper names the directory. A named directory that exists already
  // (the same dump on a dump_dir that nodes share) is written into.
  absl::StatusOr<DumpResult> Dump(const std::string& trigger,
                                  const std::vector<DumpSource>& sources,
                                  const std::optional<nlohmann::json>& diagnosis,
                                  const std::string& dump_id = "");

  // Takes one dump from `uid`'s rate (limits.per_uid.dumps_per_minute, dump_burst), or
  // returns RESOURCE_EXHAUSTED saying when the next is allowed; a refusal is logged and
  // counted in commd_flight_recorder_dumps_refused_total{trigger}. Dump does not call it:
  // the caller decides who is charged (an admin's request is not).
  absl::Status Admit(uid_t uid, const std::string& trigger);

  // Queues a dump for the dumper's own thread, so whoever noticed (a rank's death on the event
  // loop, the watchdog) never waits on encoding or disks. It is charged to the uid of the
  // sources' group (Admit): a refusal is returned (and logged), a failed dump is logged.
  absl::Status DumpLater(std::string trigger, std::vector<DumpSource> sources,
                         std::optional<nlohmann::json> diagnosis = std::nullopt,
                         std::string dump_id = "");

  const std::string& dump_dir() const { return options_.dump_dir; }

 private:
  absl::StatusOr<std::string> NewDumpDirectory(const std::string& job, const std::string& trigger,
                                               const std::string& dump_id);

  // The directory of each job in one dump, made by the first rank of the job that needs it.
  struct JobDirs {
    absl::Mutex mu;
    // By (uid, job): two users' jobs of the same name get directories of their own.
    std::map<std::pair<uid_t, std::string>, std::string> by_job ABSL_GUARDED_BY(mu);
  };
  struct RankOutcome {
    std::string job_dir;  // empty when the rank's block did not read (skipped)
    std::vector<std::string> files;
    uint64_t entries = 0;
    uint64_t invalid_entries = 0;
  };
  absl::StatusOr<std::string> JobDirectory(const DumpSource& src, const std::string& trigger,
                                           const std::string& dump_id, JobDirs* dirs);
  // Records a dump directory written for (uid, job), then deletes the uid's oldest dumps (the
  // same job's first) while its dumps exceed dump_bytes_per_uid. The newest is always kept.
  struct Kept {
    std::string job;
    std::string dir;
    uint64_t bytes = 0;
    std::vector<std::string> files;  // what this daemon wrote there
  };
  void KeepWithinShare(uid_t uid, Kept dump) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads, encodes and writes one rank. A block that does not read is logged and skipped.
  absl::Status DumpRank(const std::string& trigger, const std::string& dump_id,
                        const DumpSource& src, const std::optional<nlohmann::json>& diagnosis,
                        JobDirs* dirs, RankOutcome* out);

  const DumperOptions options_;
  prometheus::Family<prometheus::Counter>* dumps_;
  prometheus::Counter* invalid_;
  prometheus::Family<prometheus::Counter>* refused_;
  prometheus::Counter* evicted_;
  absl::Mutex mu_;  // one dump at a time: they share directories and counters
  // The dumps this daemon wrote and still keeps, oldest first, by uid.
  std::map<uid_t, std::deque<Kept>> kept_ ABSL_GUARDED_BY(mu_);

  struct Bucket {
    double tokens = 0;
    absl::Time at;
  };
  absl::Mutex rate_mu_;
  std::map<uid_t, Bucket> buckets_ ABSL_GUARDED_BY(rate_mu_);

  struct Queued {
    std::string trigger;
    std::vector<DumpSource> sources;
    std::optional<nlohmann::json> diagnosis;
    std::string dump_id;
  };
  void RunQueue();
  absl::Mutex queue_mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread worker_;  // last: started after everything it uses
};

}  // namespace commd::recorder

#endif  // COMMD_DAEMON_RECORDER_DUMPER_H_
