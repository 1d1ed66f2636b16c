#include "daemon/server/rpc.h"

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/runtime_dir.h"
#include "common/status_macros.h"

namespace commd::server {

namespace {

class PendingReactor final : public grpc::ServerUnaryReactor {
 public:
  PendingReactor(metrics::Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {}

  // Finishing and cancellation race from different threads; the mutex orders them.
  void Complete(const absl::Status& status, const std::function<void()>& fill = nullptr) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      if (fill) fill();
    }
    if (!status.ok()) COMMD_LOG(DEBUG, "rpc") << method_ << ": " << status;
    metrics_->RecordRpc(method_, static_cast<int>(status.code()), absl::Now() - start_);
    Finish(ToGrpcStatus(status));
  }

  void SetCancelCallback(std::function<void()> callback) {
    absl::MutexLock lock(&mu_);
    on_cancel_ = std::move(callback);
  }

  void OnCancel() override {
    std::function<void()> callback;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      callback = std::move(on_cancel_);
    }
    if (callback) callback();
    Complete(absl::CancelledError("client cancelled the call or its deadline passed"));
  }

  void OnDone() override { self_.reset(); }

  // The reactor lives until gRPC calls OnDone, even if every PendingCall handle is gone.
  std::shared_ptr<PendingReactor> self_;

 private:
  metrics::Metrics* const metrics_;
  const std::string method_;
  const absl::Time start_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

class PendingCallImpl final : public PendingCall {
 public:
  explicit PendingCallImpl(std::shared_ptr<PendingReactor> reactor)
      : reactor_(std::move(reactor)) {}
  void Finish(const absl::Status& status) override { reactor_->Complete(status); }
  void FinishOk(const std::function<void()>& fill) override {
    reactor_->Complete(absl::OkStatus(), fill);
  }
  void OnCancel(std::function<void()> callback) override {
    reactor_->SetCancelCallback(std::move(callback));
  }

 private:
  std::shared_ptr<PendingReactor> reactor_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Session>> RpcContext::Authenticate(
    grpc::CallbackServerContext* ctx) const {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kSessionMetadataKey);
  const absl::string_view token = it == metadata.end()
                                      ? absl::string_view()
                                      : absl::string_view(it->second.data(), it->second.size());
  ASSIGN_OR_RETURN(std::shared_ptr<const Session> session, sessions_->Authenticate(token));
  if (connections_ != nullptr) RETURN_IF_ERROR(connections_->Verify(ctx->peer(), *session));
  return session;
}

grpc::ServerUnaryReactor* RpcContext::ServeLater(
    grpc::CallbackServerContext* ctx, absl::string_view method,
    absl::FunctionRef<void(std::shared_ptr<const Session>, std::shared_ptr<PendingCall>)> handler) {
  auto reactor = std::make_shared<PendingReactor>(metrics_, std::string(method));
  reactor->self_ = reactor;
  grpc::ServerUnaryReactor* raw = reactor.get();
  auto session = Authenticate(ctx);
  if (!session.ok()) {
    reactor->Complete(session.status());
  } else {
    handler(*std::move(session), std::make_shared<PendingCallImpl>(std::move(reactor)));
  }
  return raw;
}

grpc::ServerUnaryReactor* RpcContext::Serve(
    grpc::CallbackServerContext* ctx, absl::string_view method,
    absl::FunctionRef<absl::Status(const Session&)> handler) {
  const absl::Time start = absl::Now();
  absl::Status status;
  auto session = Authenticate(ctx);
  if (!session.ok()) {
    status = session.status();
  } else {
    status = handler(**session);
  }
  if (!status.ok()) COMMD_LOG(DEBUG, "rpc") << method << ": " << status;
  metrics_->RecordRpc(method, static_cast<int>(status.code()), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace commd::server
