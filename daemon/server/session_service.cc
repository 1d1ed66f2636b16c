#include "daemon/server/session_service.h"

#include <deque>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"

namespace commd::server {

class SessionService::Stream final : public grpc::ServerWriteReactor<v1::SessionEvent> {
 public:
  Stream(SessionService* service, std::string token)
      : service_(service), token_(std::move(token)) {}

  void Push(const v1::SessionEvent& event) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    queue_.push_back(event);
    if (queue_.size() == 1) StartWrite(&queue_.front());
  }

  // Ends the stream from the daemon's side (the session ended some other way).
  void End(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken"));
      }
      return;
    }
    if (!queue_.empty() && !finished_) StartWrite(&queue_.front());
  }

  void OnCancel() override { End(absl::CancelledError("client went away")); }

  void OnDone() override {
    service_->Detach(token_, this);
    delete this;
  }

 private:
  SessionService* const service_;
  const std::string token_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::SessionEvent> queue_ ABSL_GUARDED_BY(mu_);
};

SessionService::SessionService(RpcContext* rpc, SessionRegistry* sessions)
    : rpc_(rpc), sessions_(sessions) {
  sessions_->AddEndListener(
      [this](const Session& session, const SessionEnd&) { OnSessionEnd(session); });
}

SessionService::~SessionService() = default;

grpc::ServerWriteReactor<v1::SessionEvent>* SessionService::Attach(
    grpc::CallbackServerContext* ctx, const v1::AttachRequest* request) {
  const absl::Time start = absl::Now();
  auto session = rpc_->Authenticate(ctx);
  auto* stream = new Stream(this, session.ok() ? (*session)->token : "");
  rpc_->metrics()->RecordRpc("Attach", static_cast<int>(session.status().code()),
                             absl::Now() - start);
  if (!session.ok()) {
    stream->End(session.status());
    return stream;
  }
  {
    absl::MutexLock lock(&mu_);
    if (streams_.contains((*session)->token)) {
      stream->End(absl::AlreadyExistsError("this session is already attached"));
      return stream;
    }
    streams_[(*session)->token] = stream;
  }
  v1::SessionEvent hello;
  hello.mutable_attached()->set_job_id((*session)->job_id);
  hello.mutable_attached()->set_uid((*session)->uid);
  hello.mutable_attached()->set_pid((*session)->pid);
  stream->Push(hello);
  return stream;
}

bool SessionService::Push(const std::string& token, const v1::SessionEvent& event) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(token);
  if (it == streams_.end()) return false;
  it->second->Push(event);
  return true;
}

size_t SessionService::attached() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

void SessionService::Detach(const std::string& token, Stream* stream) {
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(token);
    if (it == streams_.end() || it->second != stream) return;
    streams_.erase(it);
  }
  // The stream is how the SDK holds its session: when it ends, so does the session.
  sessions_->CloseForDisconnect(token);
}

void SessionService::OnSessionEnd(const Session& session) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(session.token);
  if (it != streams_.end()) it->second->End(absl::OkStatus());
}

}  // namespace commd::server
