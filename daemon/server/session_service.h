// gRPC Session service: the Attach stream that keeps a session open and carries the daemon's
// events (abort requested, dump requested) to the client.
//
// The session ends when its stream ends (and, independently, when its fd-channel connection
// closes or its process exits); ending the session any other way finishes the stream.
//
//   service.Push(token, event);   // queued, written in order; false if nobody is attached
//
// Thread-safe.
#ifndef COMMD_DAEMON_SERVER_SESSION_SERVICE_H_
#define COMMD_DAEMON_SERVER_SESSION_SERVICE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "commd/v1/session.grpc.pb.h"
#include "daemon/server/rpc.h"
#include "daemon/server/sessions.h"

namespace commd::server {

class SessionService final : public v1::Session::CallbackService {
 public:
  SessionService(RpcContext* rpc, SessionRegistry* sessions);
  ~SessionService() override;

  grpc::ServerWriteReactor<v1::SessionEvent>* Attach(grpc::CallbackServerContext* ctx,
                                                     const v1::AttachRequest* request) override;

  bool Push(const std::string& token, const v1::SessionEvent& event);
  size_t attached() const;

 private:
  class Stream;
  void Detach(const std::string& token, Stream* stream);
  void OnSessionEnd(const Session& session);

  RpcContext* const rpc_;
  SessionRegistry* const sessions_;
  mutable absl::Mutex mu_;
  std::map<std::string, Stream*> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_SESSION_SERVICE_H_
