#include "daemon/memory/persistent_buffers.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::memory {

PersistentBuffers::PersistentBuffers(AllocationTable* table, server::TimerQueue* timers,
                                     const v1::MemoryConfig& config)
    : table_(table), timers_(timers), config_(config) {}

absl::StatusOr<v1::PersistentBuffer> PersistentBuffers::Describe(const std::string& name,
                                                                 const Entry& entry, pid_t pid) {
  v1::PersistentBuffer out;
  out.set_name(name);
  out.set_bytes(entry.allocation->block.bytes);
  out.set_ttl_ms(absl::ToInt64Milliseconds(entry.ttl));
  ASSIGN_OR_RETURN(*out.mutable_handle(), table_->Handle(*entry.allocation, pid, -1));
  out.mutable_handle()->set_device_uuid(entry.device_uuid);
  return out;
}

absl::StatusOr<v1::PersistentBuffer> PersistentBuffers::Create(
    const server::Session& session, const v1::AllocatePersistentRequest& request) {
  RETURN_IF_ERROR(ValidateName("buffer name", request.name()));
  ASSIGN_OR_RETURN(Device device, table_->ResolveDevice(request.device(), request.device_uuid()));
  const absl::Duration max_ttl = absl::Milliseconds(config_.max_persistent_ttl_ms());
  if (request.ttl_ms() < 0 || absl::Milliseconds(request.ttl_ms()) > max_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttl_ms ", request.ttl_ms(), "; allowed 0 (", config_.default_persistent_ttl_ms(), ") to ",
        config_.max_persistent_ttl_ms(), " (memory.max_persistent_ttl_ms)"));
  }
  const Key key{session.uid, session.job_id, request.name()};
  absl::MutexLock lock(&mu_);
  if (buffers_.contains(key)) {
    return absl::AlreadyExistsError(absl::StrCat("persistent buffer '", request.name(),
                                                 "' already exists in job ", session.job_id,
                                                 "; attach to it instead"));
  }
  // Charged to the job but to no session: it must outlive the one creating it.
  ASSIGN_OR_RETURN(
      auto allocation,
      table_->Allocate({session.uid, session.job_id, ""}, device, request.bytes(),
                       absl::StrCat(session.job_id, "/", request.name()), v1::PERSISTENT));
  Entry& entry = buffers_[key];
  entry.allocation = std::move(allocation);
  entry.ttl = request.ttl_ms() == 0 ? absl::Milliseconds(config_.default_persistent_ttl_ms())
                                    : absl::Milliseconds(request.ttl_ms());
  entry.users.insert(session.token);
  if (device.kind == Device::Kind::kCuda) entry.device_uuid = request.device_uuid();
  return Describe(request.name(), entry, session.pid);
}

absl::StatusOr<v1::PersistentBuffer> PersistentBuffers::Attach(const server::Session& session,
                                                               const std::string& name) {
  RETURN_IF_ERROR(ValidateName("buffer name", name));
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find({session.uid, session.job_id, name});
  if (it == buffers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no persistent buffer '", name, "' in job ", session.job_id));
  }
  Entry& entry = it->second;
  if (entry.expiry != 0) timers_->Cancel(entry.expiry);
  entry.expiry = 0;
  entry.users.insert(session.token);
  return Describe(name, entry, session.pid);
}

absl::Status PersistentBuffers::Delete(const server::Session& session, const std::string& name) {
  RETURN_IF_ERROR(ValidateName("buffer name", name));
  std::shared_ptr<const Allocation> allocation;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find({session.uid, session.job_id, name});
    if (it == buffers_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no persistent buffer '", name, "' in job ", session.job_id));
    }
    if (it->second.expiry != 0) timers_->Cancel(it->second.expiry);
    allocation = std::move(it->second.allocation);
    buffers_.erase(it);
  }
  table_->Release(allocation->id);
  return absl::OkStatus();
}

void PersistentBuffers::OnSessionEnd(const server::Session& session) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : buffers_) {
    if (entry.users.erase(session.token) == 0 || !entry.users.empty()) continue;
    // The timer carries its own id so a stale timer (the buffer was re-attached and left
    // again since) does nothing.
    auto id = std::make_shared<server::TimerId>(0);
    *id = entry.expiry =
        timers_->Schedule(absl::Now() + entry.ttl, [this, key = key, id] { Expire(key, *id); });
  }
}

void PersistentBuffers::Expire(const Key& key, server::TimerId timer) {
  std::shared_ptr<const Allocation> allocation;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(key);
    if (it == buffers_.end() || it->second.expiry != timer || !it->second.users.empty()) return;
    allocation = std::move(it->second.allocation);
    buffers_.erase(it);
  }
  COMMD_LOG(INFO, "memory") << "persistent buffer " << std::get<1>(key) << "/" << std::get<2>(key)
                            << " expired after its TTL";
  table_->Release(allocation->id);
}

grpc::ServerUnaryReactor* MemoryService::AllocatePersistent(
    grpc::CallbackServerContext* ctx, const v1::AllocatePersistentRequest* request,
    v1::PersistentBuffer* response) {
  return rpc_->Serve(ctx, "AllocatePersistent", [&](const server::Session& session) {
    ASSIGN_OR_RETURN(*response, buffers_->Create(session, *request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* MemoryService::AttachPersistent(
    grpc::CallbackServerContext* ctx, const v1::AttachPersistentRequest* request,
    v1::PersistentBuffer* response) {
  return rpc_->Serve(ctx, "AttachPersistent", [&](const server::Session& session) {
    ASSIGN_OR_RETURN(*response, buffers_->Attach(session, request->name()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* MemoryService::DeletePersistent(
    grpc::CallbackServerContext* ctx, const v1::DeletePersistentRequest* request,
    v1::DeletePersistentResponse* response) {
  return rpc_->Serve(ctx, "DeletePersistent", [&](const server::Session& session) {
    return buffers_->Delete(session, request->name());
  });
}

}  // namespace commd::memory
