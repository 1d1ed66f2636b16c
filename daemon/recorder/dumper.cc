#include "daemon/recorder/dumper.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/recorder/ring_reader.h"
#include "format/dump_json.h"
#include "format/pickle_writer.h"

namespace commd::recorder {
namespace {

// Writes `content` to `dir/name` through a temporary file and a rename.
absl::Status WriteAtomically(const std::string& dir, const std::string& name,
                             const std::string& content) {
  const std::string tmp = absl::StrCat(dir, "/.", name, ".tmp");
  const std::string path = absl::StrCat(dir, "/", name);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  ::chmod(tmp.c_str(), 0640);
  SYS_RETURN_IF_ERROR(::rename(tmp.c_str(), path.c_str()));
  return absl::OkStatus();
}

// Group names may hold '/', which must not nest directories.
std::string FileSafe(const std::string& name) { return absl::StrReplaceAll(name, {{"/", "_"}}); }

}  // namespace

std::string NewDumpId(const std::string& trigger, const std::string& node) {
  std::string id = absl::StrCat(
      absl::FormatTime("%Y%m%dT%H%M%E3SZ", absl::Now(), absl::UTCTimeZone()), "-", trigger);
  if (!node.empty()) absl::StrAppend(&id, "-", node);
  return DumpIdOf(std::move(id));
}

std::string DumpIdOf(std::string id) {
  // A job id's alphabet, so that an id read back from etcd can be checked with ValidateJobId.
  for (char& c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        c != ':') {
      c = '_';
    }
  }
  return id.substr(0, kMaxDumpIdBytes);
}

std::string DefaultDumpDir() {
  if (const char* state = std::getenv("STATE_DIRECTORY"); state != nullptr && *state != '\0') {
    return absl::StrCat(std::string(state).substr(0, std::string(state).find(':')), "/dumps");
  }
  if (::geteuid() == 0) return "/var/lib/commd/dumps";
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/commd/dumps");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : "/tmp", "/.local/state/commd/dumps");
}

Dumper::Dumper(DumperOptions options, prometheus::Registry* registry)
    : options_(std::move(options)), worker_([this] { RunQueue(); }) {
  dumps_ = &prometheus::BuildCounter()
                .Name("commd_flight_recorder_dumps_total")
                .Help("Flight-recorder dumps written, by trigger")
                .Register(*registry);
  for (const char* trigger : {"request", "signal", "rank_death"})
    dumps_->Add({{"trigger", trigger}});
  invalid_ = &prometheus::BuildCounter()
                  .Name("commd_flight_recorder_invalid_entries_total")
                  .Help("Ring entries skipped by dumps because they did not validate")
                  .Register(*registry)
                  .Add({});
  refused_ = &prometheus::BuildCounter()
                  .Name("commd_flight_recorder_dumps_refused_total")
                  .Help("Dumps refused because their uid was over limits.per_uid.dumps_per_minute")
                  .Register(*registry);
  evicted_ = &prometheus::BuildCounter()
                  .Name("commd_flight_recorder_dumps_evicted_total")
                  .Help("Dumps deleted to keep a uid within limits.per_uid.dump_bytes")
                  .Register(*registry)
                  .Add({});
}

absl::Status Dumper::Admit(uid_t uid, const std::string& trigger) {
  const double burst = options_.dump_burst;
  const double per_minute = options_.dumps_per_minute;
  double wait_s = 0;
  {
    absl::MutexLock lock(&rate_mu_);
    const absl::Time now = absl::Now();
    Bucket& b = buckets_.try_emplace(uid, Bucket{burst, now}).first->second;
    b.tokens = std::min(burst, b.tokens + absl::ToDoubleMinutes(now - b.at) * per_minute);
    b.at = now;
    if (b.tokens >= 1) {
      b.tokens -= 1;
      return absl::OkStatus();
    }
    wait_s = (1 - b.tokens) * 60 / per_minute;
  }
  refused_->Add({{"trigger", trigger}}).Increment();
  absl::Status status = absl::ResourceExhaustedError(absl::StrFormat(
      "uid %d made its %d dumps allowed at once, refilled at %d a minute; the next is allowed "
      "in %.1f s (limits.per_uid.dumps_per_minute, limits.per_uid.dump_burst)",
      uid, options_.dump_burst, options_.dumps_per_minute, wait_s));
  COMMD_LOG(WARNING, "recorder") << trigger << " dump refused: " << status.message();
  return status;
}

Dumper::~Dumper() {
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  worker_.join();
}

absl::Status Dumper::DumpLater(std::string trigger, std::vector<DumpSource> sources,
                               std::optional<nlohmann::json> diagnosis, std::string dump_id) {
  // Sources come from one group, hence one uid; refusing here also bounds the queue.
  if (!sources.empty()) RETURN_IF_ERROR(Admit(sources.front().uid, trigger));
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(
      {std::move(trigger), std::move(sources), std::move(diagnosis), std::move(dump_id)});
  return absl::OkStatus();
}

void Dumper::RunQueue() {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return stopping_ || !queue_.empty();
  };
  for (;;) {
    Queued next;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left to write
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    if (auto r = Dump(next.trigger, next.sources, next.diagnosis, next.dump_id); !r.ok()) {
      COMMD_LOG(WARNING, "recorder") << next.trigger << " dump failed: " << r.status();
    }
  }
}

absl::StatusOr<std::string> Dumper::NewDumpDirectory(const std::string& job,
                                                     const std::string& trigger,
                                                     const std::string& dump_id) {
  const std::string base = absl::StrCat(options_.dump_dir, "/", job, "/",
                                        dump_id.empty() ? NewDumpId(trigger, "") : dump_id);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(base).parent_path(), ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create dump directory under ", options_.dump_dir, ": ", ec.message()));
  }
  if (!dump_id.empty()) {
    // One dump of a job across nodes: the other nodes' files may be there already (a shared
    // dump_dir); rank files are named by global rank, so they never collide.
    if (::mkdir(base.c_str(), 0750) == 0 || errno == EEXIST) return base;
    return ErrnoStatus(errno, absl::StrCat("mkdir ", base));
  }
  // Never overwrite: a second dump in the same millisecond gets a suffix.
  for (int n = 0; n < 1000; ++n) {
    const std::string dir = n == 0 ? base : absl::StrCat(base, "-", n);
    if (::mkdir(dir.c_str(), 0750) == 0) return dir;
    if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  }
  return absl::ResourceExhaustedError(absl::StrCat("too many dumps named ", base));
}

absl::StatusOr<std::string> Dumper::JobDirectory(const DumpSource& src, const std::string& trigger,
                                                 const std::string& dump_id, JobDirs* dirs) {
  absl::MutexLock lock(&dirs->mu);
  std::string& dir = dirs->by_job[{src.uid, src.job_id}];
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, NewDumpDirectory(src.job_id, trigger, dump_id));
  }
  return dir;
}

void Dumper::KeepWithinShare(uid_t uid, Kept dump) {
  std::deque<Kept>& kept = kept_[uid];
  const std::string job = dump.job;
  kept.push_back(std::move(dump));
  uint64_t total = 0;
  for (const Kept& k : kept) total += k.bytes;
  while (total > options_.dump_bytes_per_uid && kept.size() > 1) {
    // The oldest of the same job first; then the uid's oldest of any job. Never the newest.
    auto victim =
        std::find_if(kept.begin(), kept.end() - 1, [&](const Kept& k) { return k.job == job; });
    if (victim == kept.end() - 1) victim = kept.begin();
    // Only the files this daemon wrote: on a dump_dir that nodes share, the directory of a dump
    // that spans nodes holds the other nodes' files too. Directories go once empty.
    std::error_code ec;
    std::set<std::filesystem::path> dirs;
    for (const std::string& f : victim->files) {
      std::error_code file_ec;
      std::filesystem::remove(f, file_ec);
      if (file_ec && !ec) ec = file_ec;
      dirs.insert(std::filesystem::path(f).parent_path());
    }
    for (const auto& d : dirs) ::rmdir(d.c_str());
    ::rmdir(victim->dir.c_str());
    if (ec) {
      COMMD_LOG(WARNING, "recorder")
          << "cannot delete old dump " << victim->dir << ": " << ec.message();
    } else {
      COMMD_LOG(INFO, "recorder") << "deleted dump " << victim->dir << " (" << victim->bytes
                                  << " bytes) to keep uid " << uid
                                  << " within limits.per_uid.dump_bytes "
                                  << options_.dump_bytes_per_uid;
      evicted_->Increment();
    }
    // The job's directory goes too once its last dump is gone (fails harmlessly otherwise).
    ::rmdir(std::filesystem::path(victim->dir).parent_path().c_str());
    total -= victim->bytes;
    kept.erase(victim);
  }
}

absl::Status Dumper::DumpRank(const std::string& trigger, const std::string& dump_id,
                              const DumpSource& src, const std::optional<nlohmann::json>& diagnosis,
                              JobDirs* dirs, RankOutcome* out) {
  // From record 0: only the slots a rank wrote are read, so a dump does not fault the rest
  // of a fresh ring into the daemon's memory.
  absl::StatusOr<RingSnapshot> snapshot =
      ReadControlBlock(src.block->data(), src.block->size(), {.from_record_id = 0});
  if (!snapshot.ok()) {
    COMMD_LOG(WARNING, "recorder") << "skipping rank " << src.rank << " of " << src.job_id << "/"
                                   << src.group << ": " << snapshot.status();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const std::string dir, JobDirectory(src, trigger, dump_id, dirs));
  const std::string group_dir = absl::StrCat(dir, "/", FileSafe(src.group));
  if (::mkdir(group_dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("mkdir ", group_dir));
  }
  DumpOptions options;
  options.comm_lib_version = absl::StrCat("commd ", options_.version);
  options.trigger = trigger;
  options.diagnosis = diagnosis;
  options.process_groups.push_back({.pg_id = src.group_id,
                                    .name = src.group,
                                    .desc = src.group_description,
                                    .ranks = src.group_global_ranks});
  const RankDumpInput input{
      .snapshot = &*snapshot, .host = options_.host, .pid = src.pid, .device = src.device};
  const std::string name = absl::StrCat("rank", src.global_rank, ".json");
  const std::string json = EncodeRankDumpJson(input, options);
  RETURN_IF_ERROR(WriteAtomically(group_dir, name, json));
  out->files.push_back(absl::StrCat(group_dir, "/", name));
  if (options_.write_torch_pickle) {
    // From the JSON text, as `commctl fr export` does: the pickle says what the file says.
    ASSIGN_OR_RETURN(std::string pickle, EncodePickleFromJson(json));
    const std::string pname = absl::StrCat(kTorchTracePrefix, src.global_rank);
    RETURN_IF_ERROR(WriteAtomically(group_dir, pname, pickle));
    out->files.push_back(absl::StrCat(group_dir, "/", pname));
  }
  out->job_dir = dir;
  out->entries = snapshot->entries.size();
  out->invalid_entries = snapshot->invalid_entries;
  return absl::OkStatus();
}

absl::StatusOr<DumpResult> Dumper::Dump(const std::string& trigger,
                                        const std::vector<DumpSource>& sources,
                                        const std::optional<nlohmann::json>& diagnosis,
                                        const std::string& dump_id) {
  absl::MutexLock lock(&mu_);
  // Ranks are independent (shared memory in, one file each out), so each worker reads,
  // encodes and writes whole ranks: at most one rank's text per worker is held at a time.
  std::vector<RankOutcome> outcomes(sources.size());
  std::vector<absl::Status> statuses(sources.size());
  JobDirs dirs;
  {
    const size_t workers =
        std::min<size_t>({sources.size(), 4, std::max(1u, std::thread::hardware_concurrency())});
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < sources.size(); i = next++) {
        statuses[i] = DumpRank(trigger, dump_id, sources[i], diagnosis, &dirs, &outcomes[i]);
      }
    };
    std::vector<std::thread> threads;
    for (size_t t = 1; t < workers; ++t) threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
  }
  // What each directory of this dump holds, charged to the uid whose ranks it holds.
  std::map<std::string, Kept> written;
  std::map<std::string, uid_t> owner;
  for (size_t i = 0; i < sources.size(); ++i) {
    const RankOutcome& o = outcomes[i];
    if (o.job_dir.empty()) continue;
    Kept& k = written[o.job_dir];
    k.job = sources[i].job_id;
    k.dir = o.job_dir;
    owner[o.job_dir] = sources[i].uid;
    for (const std::string& f : o.files) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(f, ec);
      if (!ec) k.bytes += size;
      k.files.push_back(f);
    }
  }
  for (auto& [dir, k] : written) KeepWithinShare(owner[dir], std::move(k));
  DumpResult result;
  for (size_t i = 0; i < sources.size(); ++i) {
    RETURN_IF_ERROR(statuses[i]);
    const RankOutcome& o = outcomes[i];
    if (!o.job_dir.empty() && std::find(result.directories.begin(), result.directories.end(),
                                        o.job_dir) == result.directories.end()) {
      result.directories.push_back(o.job_dir);
    }
    result.files.insert(result.files.end(), o.files.begin(), o.files.end());
    result.entries += o.entries;
    result.invalid_entries += o.invalid_entries;
  }
  dumps_->Add({{"trigger", trigger}}).Increment();
  invalid_->Increment(static_cast<double>(result.invalid_entries));
  COMMD_LOG(INFO, "recorder") << "dump (" << trigger << "): " << result.files.size() << " file(s), "
                              << result.entries << " entries"
                              << (result.directories.empty() ? "" : " in " + result.directories[0]);
  return result;
}

}  // namespace commd::recorder
