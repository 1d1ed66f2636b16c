// Internal to the SDK: what every part of a Client shares (session token, channel, stubs).
#ifndef COMMD_CLIENT_SRC_CLIENT_IMPL_H_
#define COMMD_CLIENT_SRC_CLIENT_IMPL_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/src/mapping.h"
#include "commd/commd.h"
#include "commd/v1/groups.grpc.pb.h"
#include "commd/v1/health.grpc.pb.h"
#include "commd/v1/memory.grpc.pb.h"
#include "commd/v1/node.grpc.pb.h"
#include "commd/v1/recorder.grpc.pb.h"
#include "commd/v1/session.grpc.pb.h"
#include "commd/v1/store.grpc.pb.h"
#include "common/runtime_dir.h"
#include "common/unique_fd.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace commd {

class Client::Impl {
 public:
  ClientOptions options;
  std::string runtime_dir;
  std::string job_id;
  std::string token;
  absl::Mutex handles_mu;  // one exchange at a time on the fd channel
  UniqueFd handles;        // the fd channel; open for the session's life
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Node::Stub> node;
  std::unique_ptr<v1::Groups::Stub> groups;
  std::unique_ptr<v1::Memory::Stub> memory;
  std::unique_ptr<v1::Session::Stub> session;
  std::unique_ptr<v1::Recorder::Stub> recorder;
  std::unique_ptr<v1::Health::Stub> health;
  // Abort callbacks of this session's groups, by group name; run by the Attach reader thread
  // when the daemon sends an abort for the group (each at most once).
  absl::Mutex abort_mu;
  std::multimap<std::string, std::function<void(const std::string& reason)>*> abort_hooks
      ABSL_GUARDED_BY(abort_mu);
  void OnAbortEvent(const std::string& group, const std::string& reason);
  // Asks the daemon to abort this job's `group` with `reason` (cut to what the daemon takes:
  // a longer one would be refused and nothing aborted). Best effort: a failure is ignored.
  void RequestAbort(const std::string& group, const std::string& reason) const;
  std::unique_ptr<Store::Impl> store_impl;
  std::unique_ptr<Store> store;
  // The Attach stream: its context (cancelled on destruction) and reader thread.
  std::unique_ptr<grpc::ClientContext> attach_ctx;
  std::thread attach_thread;

  ~Impl();

  // Opens the Attach stream and waits (until `deadline`) for the daemon's first event.
  absl::Status Attach(absl::Time deadline);
  // Redeems import tokens for file descriptors on the fd channel.
  absl::StatusOr<std::vector<UniqueFd>> Import(const std::vector<std::string>& tokens);
  // Maps buffers the daemon handed out: imports their fds (one fd-channel exchange for all)
  // and maps each, host memory with mmap, device memory into `local_cuda_device`.
  absl::StatusOr<std::vector<std::unique_ptr<Mapping>>> MapBuffers(
      const std::vector<const v1::BufferHandle*>& handles, int local_cuda_device);

  // A context carrying the session token and the call deadline.
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata(kSessionMetadataKey, token);
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.call_timeout));
    return ctx;
  }
  // A context for a call that waits on other ranks for up to `wait`.
  std::unique_ptr<grpc::ClientContext> WaitingContext(absl::Duration wait) const {
    auto ctx = Context();
    // The daemon answers at `wait` with a message naming who is missing; the margin keeps
    // gRPC's own deadline from cutting that answer off.
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + wait + options.call_timeout));
    return ctx;
  }
};

// The Store's view of its Client: a stub on the session's channel.
class Store::Impl {
 public:
  explicit Impl(Client::Impl* client) : client(client), stub(v1::Store::NewStub(client->channel)) {}
  Client::Impl* client;
  std::unique_ptr<v1::Store::Stub> stub;
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_CLIENT_IMPL_H_
