// Named buffers that outlive their session, the basis for fast restart: a trainer writes into
// one, dies or exits, and the next process of the same job and uid re-attaches by name and
// finds the same bytes. A buffer is freed `ttl` after the last session using it ended, or by
// Delete.
//
// Names are per (uid, job id): another job's buffer is NOT_FOUND. Thread-safe.
#ifndef COMMD_DAEMON_MEMORY_PERSISTENT_BUFFERS_H_
#define COMMD_DAEMON_MEMORY_PERSISTENT_BUFFERS_H_

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "commd/v1/config.pb.h"
#include "commd/v1/memory.grpc.pb.h"
#include "daemon/memory/allocation_table.h"
#include "daemon/server/rpc.h"
#include "daemon/server/sessions.h"
#include "daemon/server/timer_queue.h"

namespace commd::memory {

class PersistentBuffers {
 public:
  // `table` and `timers` must outlive this; stop `timers` before destroying it.
  PersistentBuffers(AllocationTable* table, server::TimerQueue* timers,
                    const v1::MemoryConfig& config);

  absl::StatusOr<v1::PersistentBuffer> Create(const server::Session& session,
                                              const v1::AllocatePersistentRequest& request);
  absl::StatusOr<v1::PersistentBuffer> Attach(const server::Session& session,
                                              const std::string& name);
  absl::Status Delete(const server::Session& session, const std::string& name);
  void OnSessionEnd(const server::Session& session);

 private:
  using Key = std::tuple<uid_t, std::string, std::string>;
  struct Entry {
    std::shared_ptr<const Allocation> allocation;
    absl::Duration ttl;
    std::set<std::string> users;  // session tokens that created or attached it
    server::TimerId expiry = 0;
    // The GPU's UUID as the creator named it (ResolveDevice found a device with it); empty
    // for host memory and clients that sent none. Attaching clients map by it.
    std::string device_uuid;
  };
  absl::StatusOr<v1::PersistentBuffer> Describe(const std::string& name, const Entry& entry,
                                                pid_t pid);
  void Expire(const Key& key, server::TimerId timer);

  AllocationTable* const table_;
  server::TimerQueue* const timers_;
  const v1::MemoryConfig config_;
  absl::Mutex mu_;
  std::map<Key, Entry> buffers_ ABSL_GUARDED_BY(mu_);
};

// gRPC Memory service over PersistentBuffers.
class MemoryService final : public v1::Memory::CallbackService {
 public:
  MemoryService(server::RpcContext* rpc, PersistentBuffers* buffers)
      : rpc_(rpc), buffers_(buffers) {}
  grpc::ServerUnaryReactor* AllocatePersistent(grpc::CallbackServerContext* ctx,
                                               const v1::AllocatePersistentRequest* request,
                                               v1::PersistentBuffer* response) override;
  grpc::ServerUnaryReactor* AttachPersistent(grpc::CallbackServerContext* ctx,
                                             const v1::AttachPersistentRequest* request,
                                             v1::PersistentBuffer* response) override;
  grpc::ServerUnaryReactor* DeletePersistent(grpc::CallbackServerContext* ctx,
                                             const v1::DeletePersistentRequest* request,
                                             v1::DeletePersistentResponse* response) override;

 private:
  server::RpcContext* const rpc_;
  PersistentBuffers* const buffers_;
};

}  // namespace commd::memory

#endif  // COMMD_DAEMON_MEMORY_PERSISTENT_BUFFERS_H_
