#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/src/client_impl.h"
#include "commd/commd.h"
#include "commd/v1/handles.pb.h"
#include "commd/v1/node.grpc.pb.h"
#include "common/control_block.h"
#include "common/grpc_status.h"
#include "common/runtime_dir.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace commd {
namespace {

constexpr char kClientVersion[] = COMMD_VERSION;
// How long destroying a Client waits for the daemon to confirm the session's close.
constexpr absl::Duration kCloseWait = absl::Seconds(5);

std::string ResolveJobId(const std::string& explicit_job) {
  if (!explicit_job.empty()) return explicit_job;
  if (const char* env = std::getenv("COMMD_JOB_ID"); env != nullptr && *env != '\0') return env;
  return "default";
}

// Connects to the fd channel, retrying while nobody listens until `deadline`.
absl::StatusOr<UniqueFd> ConnectWithRetry(const std::string& path, absl::Time deadline) {
  absl::Duration backoff = absl::Milliseconds(10);
  for (;;) {
    auto fd = ConnectUnix(path, SOCK_SEQPACKET);
    if (fd.ok() || !absl::IsUnavailable(fd.status())) return fd;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::UnavailableError(
          absl::StrCat(fd.status().message(),
                       "; is commd running? (set COMMD_RUNTIME_DIR or "
                       "ClientOptions::runtime_dir if it uses another runtime dir)"));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

// One request/response exchange on the fd channel, bounded by `deadline`.
absl::StatusOr<v1::HandleResponse> Exchange(int fd, const v1::HandleRequest& request,
                                            absl::Time deadline) {
  RETURN_IF_ERROR(SendMessage(fd, request.SerializeAsString()));
  const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  const timeval tv = absl::ToTimeval(left);
  SYS_RETURN_IF_ERROR(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
  auto received = ReceiveMessage(fd, kMaxHandlePacketBytes);
  if (!received.ok()) return received.status();
  if (!received->has_value()) {
    return absl::DeadlineExceededError("commd did not answer on the fd channel in time");
  }
  v1::HandleResponse response;
  if (!response.ParseFromString((*received)->bytes)) {
    return absl::InternalError("commd sent an fd-channel response that does not parse");
  }
  if (response.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
  }
  return response;
}

}  // namespace

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Client::Impl::~Impl() {
  // Say goodbye before the sockets close: a session that merely disconnects looks like a
  // process on its way out, and one whose process then exits looks dead to its peers (a
  // rank_death dump, its groups aborted). Bounded, and best effort: a daemon that is gone or
  // does not answer ends the session when the sockets close.
  if (!token.empty() && handles.get() >= 0) {
    v1::HandleRequest request;
    request.mutable_close_session()->set_session_token(token);
    absl::MutexLock lock(&handles_mu);
    (void)Exchange(handles.get(), request,
                   absl::Now() + std::min(options.call_timeout, kCloseWait));
  }
  if (attach_ctx != nullptr) attach_ctx->TryCancel();
  if (attach_thread.joinable()) attach_thread.join();
}

absl::Status Client::Impl::Attach(absl::Time deadline) {
  attach_ctx = std::make_unique<grpc::ClientContext>();
  attach_ctx->AddMetadata(kSessionMetadataKey, token);
  auto reader = std::shared_ptr<grpc::ClientReader<v1::SessionEvent>>(
      session->Attach(attach_ctx.get(), v1::AttachRequest()));
  // The first event confirms the daemon holds the stream; wait for it on the reader thread
  // so that a daemon that never answers cannot block Connect past its deadline.
  auto first = std::make_shared<absl::Notification>();
  auto ok = std::make_shared<std::atomic<bool>>(false);
  attach_thread = std::thread([this, reader, first, ok] {
    v1::SessionEvent event;
    ok->store(reader->Read(&event) && event.has_attached());
    first->Notify();
    while (reader->Read(&event)) {
      // Abort and dump events are acted on by the parts of the SDK that own groups.
      if (event.has_abort_requested()) {
        OnAbortEvent(event.abort_requested().group(), event.abort_requested().reason());
      }
    }
    reader->Finish();
  });
  if (!first->WaitForNotificationWithDeadline(deadline) || !ok->load()) {
    return absl::UnavailableError("commd did not confirm the session's event stream in time");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UniqueFd>> Client::Impl::Import(const std::vector<std::string>& tokens) {
  std::vector<UniqueFd> fds;
  absl::MutexLock lock(&handles_mu);
  for (size_t begin = 0; begin < tokens.size(); begin += kMaxFdsPerMessage) {
    v1::HandleRequest request;
    const size_t end = std::min(tokens.size(), begin + kMaxFdsPerMessage);
    for (size_t i = begin; i < end; ++i) request.mutable_import()->add_tokens(tokens[i]);
    RETURN_IF_ERROR(SendMessage(handles.get(), request.SerializeAsString()));
    const timeval tv = absl::ToTimeval(options.call_timeout);
    SYS_RETURN_IF_ERROR(::setsockopt(handles.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
    ASSIGN_OR_RETURN(auto received, ReceiveMessage(handles.get(), kMaxHandlePacketBytes));
    if (!received.has_value()) return absl::DeadlineExceededError("commd did not answer an import");
    v1::HandleResponse response;
    if (!response.ParseFromString(received->bytes)) {
      return absl::InternalError("commd sent an import answer that does not parse");
    }
    if (response.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
    }
    if (received->fds.size() != end - begin) {
      return absl::InternalError(
          absl::StrCat("commd sent ", received->fds.size(), " fds for ", end - begin, " tokens"));
    }
    for (UniqueFd& fd : received->fds) fds.push_back(std::move(fd));
  }
  return fds;
}

absl::StatusOr<std::vector<std::unique_ptr<Mapping>>> Client::Impl::MapBuffers(
    const std::vector<const v1::BufferHandle*>& handles, int local_cuda_device) {
  std::vector<std::string> tokens;
  for (const v1::BufferHandle* h : handles) {
    if (!h->import_token().empty()) tokens.push_back(h->import_token());
  }
  std::vector<UniqueFd> fds;
  if (!tokens.empty()) {
    ASSIGN_OR_RETURN(fds, Import(tokens));
  }
  std::vector<std::unique_ptr<Mapping>> out;
  size_t next_fd = 0;
  for (const v1::BufferHandle* h : handles) {
    UniqueFd fd = h->import_token().empty() ? UniqueFd() : std::move(fds[next_fd++]);
    if (h->device() == "host") {
      ASSIGN_OR_RETURN(auto m, MapHostBuffer(fd, h->mapped_bytes()));
      out.push_back(std::move(m));
    } else {
      ASSIGN_OR_RETURN(auto m, MapCudaBuffer(*h, std::move(fd), local_cuda_device));
      out.push_back(std::move(m));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->runtime_dir = ClientRuntimeDir(options.runtime_dir);
  impl->job_id = ResolveJobId(options.job_id);
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  const std::string handles_path = absl::StrCat(impl->runtime_dir, "/", kHandleSocketName);
  ASSIGN_OR_RETURN(impl->handles, ConnectWithRetry(handles_path, deadline));

  v1::HandleRequest request;
  request.mutable_open_session()->set_job_id(impl->job_id);
  request.mutable_open_session()->set_client_version(kClientVersion);
  ASSIGN_OR_RETURN(v1::HandleResponse response, Exchange(impl->handles.get(), request, deadline));
  impl->token = response.open_session().session_token();
  impl->job_id = response.open_session().job_id();

  const std::string grpc_path = absl::StrCat(impl->runtime_dir, "/", kGrpcSocketName);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("unix:", grpc_path),
                                           grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::UnavailableError(absl::StrCat("cannot reach commd's gRPC socket ", grpc_path,
                                               " within the connect timeout"));
  }
  impl->channel = channel;
  impl->node = v1::Node::NewStub(channel);
  impl->groups = v1::Groups::NewStub(channel);
  impl->memory = v1::Memory::NewStub(channel);
  impl->session = v1::Session::NewStub(channel);
  impl->recorder = v1::Recorder::NewStub(channel);
  impl->health = v1::Health::NewStub(channel);
  impl->store_impl = std::make_unique<Store::Impl>(impl.get());
  impl->store = std::make_unique<Store>(impl->store_impl.get());
  RETURN_IF_ERROR(impl->Attach(deadline));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<v1::NodeStatus> Client::GetStatus() {
  v1::NodeStatus response;
  RETURN_IF_ERROR(FromGrpcStatus(impl_->node->GetStatus(impl_->Context().get(), {}, &response)));
  return response;
}

absl::StatusOr<v1::Topology> Client::GetTopology() {
  v1::Topology response;
  RETURN_IF_ERROR(FromGrpcStatus(impl_->node->GetTopology(impl_->Context().get(), {}, &response)));
  return response;
}

absl::StatusOr<v1::ListClusterNodesResponse> Client::ListClusterNodes(
    const v1::ListClusterNodesRequest& request) {
  v1::ListClusterNodesResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->node->ListClusterNodes(impl_->Context().get(), request, &response)));
  return response;
}

Store& Client::store() { return *impl_->store; }

absl::StatusOr<v1::DumpResponse> Client::Dump(const std::string& group, const std::string& job,
                                              bool all_jobs) {
  v1::DumpRequest request;
  request.set_group(group);
  request.set_job_id(job);
  request.set_all_jobs(all_jobs);
  return Dump(request);
}

absl::StatusOr<v1::DumpResponse> Client::Dump(const v1::DumpRequest& request) {
  v1::DumpResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->recorder->Dump(impl_->Context().get(), request, &response)));
  return response;
}

void Client::Impl::OnAbortEvent(const std::string& group, const std::string& reason) {
  absl::MutexLock lock(&abort_mu);
  auto [begin, end] = abort_hooks.equal_range(group);
  for (auto it = begin; it != end; ++it) (*it->second)(reason);
}

void Client::Impl::RequestAbort(const std::string& group, const std::string& reason) const {
  v1::AbortRequest request;
  request.set_group(group);
  request.set_reason(reason.substr(0, kMaxAbortReasonBytes));
  v1::AbortResponse response;
  (void)health->Abort(Context().get(), request, &response);
}

absl::StatusOr<v1::GetHealthResponse> Client::GetHealth(const std::string& group,
                                                        const std::string& job, bool all_jobs) {
  v1::GetHealthRequest request;
  request.set_group(group);
  request.set_job_id(job);
  request.set_all_jobs(all_jobs);
  return GetHealth(request);
}

absl::StatusOr<v1::GetHealthResponse> Client::GetHealth(const v1::GetHealthRequest& request) {
  v1::GetHealthResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->health->GetHealth(impl_->Context().get(), request, &response)));
  return response;
}

absl::StatusOr<int> Client::Abort(const std::string& group, const std::string& reason,
                                  const std::string& job) {
  v1::AbortRequest request;
  request.set_group(group);
  request.set_job_id(job);
  request.set_reason(reason);
  v1::AbortResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(impl_->health->Abort(impl_->Context().get(), request, &response)));
  return response.ranks_notified();
}

const std::string& Client::runtime_dir() const { return impl_->runtime_dir; }
const std::string& Client::job_id() const { return impl_->job_id; }

}  // namespace commd
