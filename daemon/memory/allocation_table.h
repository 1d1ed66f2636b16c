// Every allocation the daemon owns: who owns it, what it counts against, how long it lives,
// and the single-use tokens that let a client process fetch its file descriptor.
//
//   ASSIGN_OR_RETURN(auto alloc, table.Allocate(owner, Device::Host(), 1 << 20, "job/g/r0"));
//   ASSIGN_OR_RETURN(v1::BufferHandle h, table.Handle(*alloc, peer_pid, /*rank=*/0));
//   ... client redeems h.import_token on the fd channel: table.Redeem({token}, pid) ...
//   table.Release(alloc->id);
//
// Limits (limits.max_allocation_bytes, max_bytes_per_job, max_allocations_per_session, and the
// uid's shares in limits.per_uid) are checked here, once for every kind of allocation. The
// count limits count what the daemon holds: one file descriptor per allocation. Thread-safe.
#ifndef COMMD_DAEMON_MEMORY_ALLOCATION_TABLE_H_
#define COMMD_DAEMON_MEMORY_ALLOCATION_TABLE_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/config.pb.h"
#include "commd/v1/memory.pb.h"
#include "common/uid_share.h"
#include "daemon/memory/memory_backend.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::memory {

struct Owner {
  uid_t uid = 0;
  std::string job_id;
  std::string session_token;  // the session charged for it (empty: none, e.g. persistent)
};

// What an allocation is for, beyond its lifetime: control blocks have a share of their own.
enum class Purpose { kBuffer, kControlBlock };

struct Allocation {
  uint64_t id = 0;
  Owner owner;
  std::string label;
  v1::Lifetime lifetime = v1::SESSION;
  Purpose purpose = Purpose::kBuffer;
  MemoryBlock block;
  std::string backend;
};

struct Redeemed {
  UniqueFd fd;
  uint64_t bytes = 0;
};

class AllocationTable {
 public:
  // `host` must be non-null; `cuda` may be null (no GPU memory on this node).
  AllocationTable(std::unique_ptr<MemoryBackend> host, std::unique_ptr<MemoryBackend> cuda,
                  const v1::DaemonConfig& config, prometheus::Registry* registry);
  ~AllocationTable();

  absl::StatusOr<std::shared_ptr<const Allocation>> Allocate(const Owner& owner,
                                                             const Device& device, size_t bytes,
                                                             absl::string_view label,
                                                             v1::Lifetime lifetime,
                                                             Purpose purpose = Purpose::kBuffer);
  // Frees the memory now (mappings clients already hold stay valid until they unmap).
  void Release(uint64_t id);

  // A handle for process `pid` to import the allocation: a fresh single-use token that
  // expires after session.import_token_ttl_ms.
  absl::StatusOr<v1::BufferHandle> Handle(const Allocation& allocation, pid_t pid, int rank);

  // Redeems tokens for process `pid`: all or nothing. A token that is unknown, used, expired,
  // issued to another process, or whose allocation is gone → NOT_FOUND and no fd at all.
  absl::StatusOr<std::vector<Redeemed>> Redeem(const std::vector<std::string>& tokens, pid_t pid);

  // Whether this node has a backend for `device`.
  bool Serves(const Device& device) const { return BackendFor(device) != nullptr; }
  // The device a request names: `device` ("host", "cuda:N"; empty: host), or for CUDA the
  // device whose `uuid` the client sent when it did (its ordinal may differ here: per-process
  // CUDA_VISIBLE_DEVICES). INVALID_ARGUMENT for a device this node does not serve,
  // FAILED_PRECONDITION for a UUID the daemon does not see.
  absl::StatusOr<Device> ResolveDevice(absl::string_view device, absl::string_view uuid) const;

  uint64_t job_bytes(uid_t uid, const std::string& job) const;
  // What `uid` holds, as limits.per_uid counts it.
  struct UidUse {
    uint64_t allocations = 0;
    uint64_t host_bytes = 0;
    uint64_t cuda_bytes = 0;
    uint64_t control_blocks = 0;
    uint64_t persistent_buffers = 0;
    uint64_t persistent_bytes = 0;
  };
  UidUse uid_use(uid_t uid) const;
  uint64_t total_bytes() const;
  size_t count() const;

 private:
  struct Token {
    std::weak_ptr<const Allocation> allocation;
    pid_t pid;
    absl::Time expires;
  };
  MemoryBackend* BackendFor(const Device& device) const;
  struct LockHeld {};
  uint64_t job_bytes(uid_t uid, const std::string& job, LockHeld) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks every limit for one more allocation of `bytes` and, when it fits, counts it (so
  // that concurrent callers cannot both pass the check); Uncount undoes it.
  absl::Status Reserve(const Owner& owner, const Device& device, uint64_t bytes,
                       v1::Lifetime lifetime, Purpose purpose) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckUidShare(const Owner& owner, const Device& device, uint64_t bytes,
                             v1::Lifetime lifetime, Purpose purpose) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Count(const Owner& owner, const Device& device, uint64_t bytes, v1::Lifetime lifetime,
             Purpose purpose, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds (sign +1) or removes (-1) an allocation from the gauges: O(1), not a recount.
  void CountInMetrics(const Allocation& allocation, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpiredTokens(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<MemoryBackend> host_;
  const std::unique_ptr<MemoryBackend> cuda_;
  const v1::LimitsConfig limits_;
  const v1::PerUidLimits per_uid_;
  const absl::Duration token_ttl_;
  prometheus::Family<prometheus::Gauge>* bytes_gauge_;
  prometheus::Family<prometheus::Gauge>* count_gauge_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Allocation>> allocations_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uid_t, std::string>, uint64_t> job_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> session_counts_ ABSL_GUARDED_BY(mu_);
  // Per uid (limits.per_uid).
  UidTally uid_allocations_ ABSL_GUARDED_BY(mu_);
  UidTally uid_host_bytes_ ABSL_GUARDED_BY(mu_);
  UidTally uid_cuda_bytes_ ABSL_GUARDED_BY(mu_);
  UidTally uid_control_blocks_ ABSL_GUARDED_BY(mu_);
  UidTally uid_persistent_buffers_ ABSL_GUARDED_BY(mu_);
  UidTally uid_persistent_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Token> tokens_ ABSL_GUARDED_BY(mu_);
};

// Human-readable byte counts for error messages ("96 GiB", "1.5 MiB", "4095 bytes").
std::string FormatBytes(uint64_t bytes);

}  // namespace commd::memory

#endif  // COMMD_DAEMON_MEMORY_ALLOCATION_TABLE_H_
