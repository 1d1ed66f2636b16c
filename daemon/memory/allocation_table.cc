#include "daemon/memory/allocation_table.h"

#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "common/random_token.h"
#include "common/status_macros.h"

namespace commd::memory {
namespace {

// Bounds the token map when clients ask for handles they never redeem.
constexpr size_t kTokenSweepThreshold = 4096;

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " bytes");
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  if (v == static_cast<double>(static_cast<uint64_t>(v))) {
    return absl::StrCat(static_cast<uint64_t>(v), " ", kUnits[unit]);
  }
  return absl::StrFormat("%.1f %s (%d bytes)", v, kUnits[unit], bytes);
}

AllocationTable::AllocationTable(std::unique_ptr<MemoryBackend> host,
                                 std::unique_ptr<MemoryBackend> cuda,
                                 const v1::DaemonConfig& config, prometheus::Registry* registry)
    : host_(std::move(host)),
      cuda_(std::move(cuda)),
      limits_(config.limits()),
      per_uid_(config.limits().per_uid()),
      token_ttl_(absl::Milliseconds(config.session().import_token_ttl_ms())) {
  bytes_gauge_ = &prometheus::BuildGauge()
                      .Name("commd_memory_allocated_bytes")
                      .Help("Bytes of memory the daemon holds for clients, by backend and device")
                      .Register(*registry);
  count_gauge_ = &prometheus::BuildGauge()
                      .Name("commd_allocations")
                      .Help("Allocations the daemon holds, by backend and lifetime")
                      .Register(*registry);
  // Report zeros from the start, so dashboards see the series before the first allocation.
  bytes_gauge_->Add({{"backend", "host"}, {"device", "host"}}).Set(0);
  for (const char* lifetime : {"SESSION", "PERSISTENT"}) {
    count_gauge_->Add({{"backend", "host"}, {"lifetime", lifetime}}).Set(0);
  }
}

AllocationTable::~AllocationTable() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, a] : allocations_) BackendFor(a->block.device)->Release(std::move(a->block));
}

absl::StatusOr<Device> AllocationTable::ResolveDevice(absl::string_view device,
                                                      absl::string_view uuid) const {
  // A UUID is "GPU-" and 36 characters; a longer one is refused before it is echoed or
  // compared, so a client's request costs the daemon no more than its own bound.
  constexpr size_t kMaxUuidBytes = 64;
  if (uuid.size() > kMaxUuidBytes) {
    return absl::InvalidArgumentError(absl::StrCat("device_uuid ", QuoteForError(uuid),
                                                   " is too long; allowed at most ", kMaxUuidBytes,
                                                   " bytes"));
  }
  ASSIGN_OR_RETURN(Device d, ParseDevice(device.empty() ? "host" : device));
  if (!Serves(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", d.ToString(), " is not available on this node; use 'host'"));
  }
  if (d.kind == Device::Kind::kHost || uuid.empty()) return d;
  return BackendFor(d)->DeviceByUuid(uuid);
}

MemoryBackend* AllocationTable::BackendFor(const Device& device) const {
  return device.kind == Device::Kind::kCuda ? cuda_.get() : host_.get();
}

absl::StatusOr<std::shared_ptr<const Allocation>> AllocationTable::Allocate(
    const Owner& owner, const Device& device, size_t bytes, absl::string_view label,
    v1::Lifetime lifetime, Purpose purpose) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of 0 bytes for ", label,
                                                   "; allowed 1 byte to ",
                                                   FormatBytes(limits_.max_allocation_bytes())));
  }
  if (bytes > limits_.max_allocation_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocation of ", FormatBytes(bytes), " for ", label, " exceeds the limit ",
        FormatBytes(limits_.max_allocation_bytes()), " (limits.max_allocation_bytes)"));
  }
  MemoryBackend* backend = BackendFor(device);
  if (backend == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device.ToString(),
                                                   " is not available on this node (no CUDA "
                                                   "memory backend); use 'host'"));
  }
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Reserve(owner, device, bytes, lifetime, purpose));
  }
  absl::StatusOr<MemoryBlock> block = backend->Allocate(device, bytes, label);
  absl::MutexLock lock(&mu_);
  Count(owner, device, bytes, lifetime, purpose, -1);
  if (!block.ok()) return block.status();
  // The backend rounds up (pages, GPU granularity): what it actually holds must fit too.
  if (absl::Status fits = Reserve(owner, device, block->bytes, lifetime, purpose); !fits.ok()) {
    backend->Release(*std::move(block));
    return fits;
  }
  auto allocation = std::make_shared<Allocation>();
  allocation->owner = owner;
  allocation->label = std::string(label);
  allocation->lifetime = lifetime;
  allocation->purpose = purpose;
  allocation->backend = std::string(backend->name());
  allocation->block = *std::move(block);
  allocation->id = next_id_++;
  allocations_[allocation->id] = allocation;
  CountInMetrics(*allocation, +1);
  return std::shared_ptr<const Allocation>(allocation);
}

absl::Status AllocationTable::Reserve(const Owner& owner, const Device& device, uint64_t bytes,
                                      v1::Lifetime lifetime, Purpose purpose) {
  const uint64_t held = job_bytes(owner.uid, owner.job_id, LockHeld{});
  if (held + bytes > limits_.max_bytes_per_job()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocation of ", FormatBytes(bytes), " would bring job ", owner.job_id,
                     " to ", FormatBytes(held + bytes), ", over its limit ",
                     FormatBytes(limits_.max_bytes_per_job()), " (limits.max_bytes_per_job)"));
  }
  if (!owner.session_token.empty()) {
    auto it = session_counts_.find(owner.session_token);
    if (it != session_counts_.end() && it->second >= limits_.max_allocations_per_session()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session holds ", it->second,
                       " allocations, the limit (limits.max_allocations_per_session)"));
    }
  }
  RETURN_IF_ERROR(CheckUidShare(owner, device, bytes, lifetime, purpose));
  Count(owner, device, bytes, lifetime, purpose, +1);
  return absl::OkStatus();
}

absl::Status AllocationTable::CheckUidShare(const Owner& owner, const Device& device,
                                            uint64_t bytes, v1::Lifetime lifetime,
                                            Purpose purpose) const {
  const uid_t uid = owner.uid;
  if (uid_allocations_.of(uid) >= per_uid_.allocations()) {
    return UidShareExhausted(uid, uid_allocations_.of(uid), per_uid_.allocations(), "allocations",
                             "allocations");
  }
  const bool cuda = device.kind == Device::Kind::kCuda;
  const uint64_t held = (cuda ? uid_cuda_bytes_ : uid_host_bytes_).of(uid);
  const uint64_t limit = cuda ? per_uid_.cuda_bytes() : per_uid_.host_bytes();
  if (held + bytes > limit) {
    return UidShareExhausted(uid, FormatBytes(held), FormatBytes(limit),
                             cuda ? "of GPU memory" : "of host memory",
                             cuda ? "cuda_bytes" : "host_bytes", FormatBytes(bytes));
  }
  if (purpose == Purpose::kControlBlock &&
      uid_control_blocks_.of(uid) >= per_uid_.control_blocks()) {
    return UidShareExhausted(uid, uid_control_blocks_.of(uid), per_uid_.control_blocks(),
                             "control blocks", "control_blocks");
  }
  if (lifetime == v1::PERSISTENT) {
    if (uid_persistent_buffers_.of(uid) >= per_uid_.persistent_buffers()) {
      return UidShareExhausted(uid, uid_persistent_buffers_.of(uid), per_uid_.persistent_buffers(),
                               "persistent buffers", "persistent_buffers");
    }
    const uint64_t in_persistent = uid_persistent_bytes_.of(uid);
    if (in_persistent + bytes > per_uid_.persistent_bytes()) {
      return UidShareExhausted(uid, FormatBytes(in_persistent),
                               FormatBytes(per_uid_.persistent_bytes()), "in persistent buffers",
                               "persistent_bytes", FormatBytes(bytes));
    }
  }
  return absl::OkStatus();
}

void AllocationTable::Count(const Owner& owner, const Device& device, uint64_t bytes,
                            v1::Lifetime lifetime, Purpose purpose, int sign) {
  auto adjust = [sign, uid = owner.uid](UidTally& tally, uint64_t n) {
    sign > 0 ? tally.Add(uid, n) : tally.Sub(uid, n);
  };
  const auto job = std::make_pair(owner.uid, owner.job_id);
  if (sign > 0) {
    job_bytes_[job] += bytes;
  } else if (auto it = job_bytes_.find(job); it != job_bytes_.end() && (it->second -= bytes) == 0) {
    job_bytes_.erase(it);
  }
  if (!owner.session_token.empty()) {
    if (sign > 0) {
      ++session_counts_[owner.session_token];
    } else if (--session_counts_[owner.session_token] == 0) {
      session_counts_.erase(owner.session_token);
    }
  }
  adjust(uid_allocations_, 1);
  adjust(device.kind == Device::Kind::kCuda ? uid_cuda_bytes_ : uid_host_bytes_, bytes);
  if (purpose == Purpose::kControlBlock) adjust(uid_control_blocks_, 1);
  if (lifetime == v1::PERSISTENT) {
    adjust(uid_persistent_buffers_, 1);
    adjust(uid_persistent_bytes_, bytes);
  }
}

void AllocationTable::Release(uint64_t id) {
  std::shared_ptr<Allocation> allocation;
  {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.find(id);
    if (it == allocations_.end()) return;
    allocation = std::move(it->second);
    allocations_.erase(it);
    Count(allocation->owner, allocation->block.device, allocation->block.bytes,
          allocation->lifetime, allocation->purpose, -1);
    CountInMetrics(*allocation, -1);
  }
  BackendFor(allocation->block.device)->Release(std::move(allocation->block));
}

absl::StatusOr<v1::BufferHandle> AllocationTable::Handle(const Allocation& allocation, pid_t pid,
                                                         int rank) {
  v1::BufferHandle handle;
  handle.set_rank(rank);
  handle.set_mapped_bytes(allocation.block.bytes);
  handle.set_device(allocation.block.device.ToString());
  handle.set_backend(allocation.backend);
  handle.set_opaque_handle(allocation.block.opaque_handle);
  handle.set_opaque_handle_kind(
      allocation.block.opaque_kind == MemoryBlock::OpaqueKind::kFabric ? v1::OPAQUE_HANDLE_FABRIC
      : allocation.block.opaque_kind == MemoryBlock::OpaqueKind::kLegacyIpc
          ? v1::OPAQUE_HANDLE_LEGACY_IPC
          : v1::OPAQUE_HANDLE_NONE);
  // Legacy CUDA IPC handles are 64 plain bytes that travel in the answer; there is no fd.
  if (!allocation.block.fd.valid()) return handle;
  ASSIGN_OR_RETURN(std::string token, RandomToken());
  handle.set_import_token(token);
  absl::MutexLock lock(&mu_);
  auto it = allocations_.find(allocation.id);
  if (it == allocations_.end()) {
    return absl::NotFoundError(absl::StrCat("allocation ", allocation.label, " was released"));
  }
  const absl::Time now = absl::Now();
  if (tokens_.size() >= kTokenSweepThreshold) DropExpiredTokens(now);
  tokens_[token] = Token{it->second, pid, now + token_ttl_};
  return handle;
}

absl::StatusOr<std::vector<Redeemed>> AllocationTable::Redeem(
    const std::vector<std::string>& tokens, pid_t pid) {
  std::vector<std::shared_ptr<const Allocation>> allocations;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (const std::string& token : tokens) {
      auto it = tokens_.find(token);
      // One message for every failure, so a token's existence leaks nothing to a stranger.
      auto allocation = it == tokens_.end() ? nullptr : it->second.allocation.lock();
      if (allocation == nullptr || it->second.pid != pid || it->second.expires < now) {
        return absl::NotFoundError(
            "import token unknown, already used, expired, or issued to another process");
      }
      allocations.push_back(std::move(allocation));
    }
    for (const std::string& token : tokens) tokens_.erase(token);
  }
  std::vector<Redeemed> out;
  for (const auto& allocation : allocations) {
    ASSIGN_OR_RETURN(ExportedMemory exported,
                     BackendFor(allocation->block.device)->Export(allocation->block));
    out.push_back(Redeemed{std::move(exported.fd), allocation->block.bytes});
  }
  return out;
}

void AllocationTable::DropExpiredTokens(absl::Time now) {
  for (auto it = tokens_.begin(); it != tokens_.end();) {
    it = (it->second.expires < now || it->second.allocation.expired()) ? tokens_.erase(it)
                                                                       : std::next(it);
  }
}

void AllocationTable::CountInMetrics(const Allocation& a, int sign) {
  const double bytes = sign * static_cast<double>(a.block.bytes);
  const std::pair<std::string, std::string> by_device{a.backend, a.block.device.ToString()};
  const std::pair<std::string, std::string> by_lifetime{a.backend, v1::Lifetime_Name(a.lifetime)};
  bytes_gauge_->Add({{"backend", by_device.first}, {"device", by_device.second}}).Increment(bytes);
  count_gauge_->Add({{"backend", by_lifetime.first}, {"lifetime", by_lifetime.second}})
      .Increment(sign);
}

uint64_t AllocationTable::job_bytes(uid_t uid, const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return job_bytes(uid, job, LockHeld{});
}

uint64_t AllocationTable::job_bytes(uid_t uid, const std::string& job, LockHeld) const {
  auto it = job_bytes_.find({uid, job});
  return it == job_bytes_.end() ? 0 : it->second;
}

AllocationTable::UidUse AllocationTable::uid_use(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  return {.allocations = uid_allocations_.of(uid),
          .host_bytes = uid_host_bytes_.of(uid),
          .cuda_bytes = uid_cuda_bytes_.of(uid),
          .control_blocks = uid_control_blocks_.of(uid),
          .persistent_buffers = uid_persistent_buffers_.of(uid),
          .persistent_bytes = uid_persistent_bytes_.of(uid)};
}

uint64_t AllocationTable::total_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [job, bytes] : job_bytes_) total += bytes;
  return total;
}

size_t AllocationTable::count() const {
  absl::MutexLock lock(&mu_);
  return allocations_.size();
}

}  // namespace commd::memory
