// What every gRPC handler does around its own work: find the caller's session from the
// "commd-session" metadata, time the call, count errors, and convert the status once.
//
//   return rpc_->Serve(ctx, "GetStatus", [&](const Session& s) -> absl::Status { ... });
//
// Handlers run on gRPC's callback threads and must not block for long; thread-safe.
#ifndef COMMD_DAEMON_SERVER_RPC_H_
#define COMMD_DAEMON_SERVER_RPC_H_

#include <functional>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/grpc_connections.h"
#include "daemon/server/sessions.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace commd::server {

// A unary call whose answer comes later, from whichever thread completes it (the last rank
// of a rendezvous, a store write, a deadline). Finish is called at most once; later calls are
// ignored, so racing completions need no coordination of their own.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  // Sends `status` (the response message must be filled before an OK finish).
  virtual void Finish(const absl::Status& status) = 0;
  // Runs `fill` (which writes the response) and sends OK, unless the call already finished
  // (a cancellation racing the answer): the response is never written after gRPC owns it.
  // (This default, for calls no cancellation can race, fills and finishes.)
  virtual void FinishOk(const std::function<void()>& fill) {
    fill();
    Finish(absl::OkStatus());
  }
  // Runs `callback` once if the client goes away (cancels, disconnects, its deadline passes)
  // before Finish. Set it before anything else can finish the call.
  virtual void OnCancel(std::function<void()> callback) = 0;
};

class RpcContext {
 public:
  // `connections`, when set, binds each token to the process that opened its session (see
  // grpc_connections.h); without it any holder of a token is its session.
  RpcContext(SessionRegistry* sessions, metrics::Metrics* metrics,
             GrpcConnections* connections = nullptr)
      : sessions_(sessions), metrics_(metrics), connections_(connections) {}

  // Authenticates, runs `handler`, records metrics, and finishes the call.
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, absl::string_view method,
                                  absl::FunctionRef<absl::Status(const Session&)> handler);

  // Authenticates and hands `handler` a PendingCall to finish later. When authentication
  // fails the call finishes at once and `handler` is not run.
  grpc::ServerUnaryReactor* ServeLater(
      grpc::CallbackServerContext* ctx, absl::string_view method,
      absl::FunctionRef<void(std::shared_ptr<const Session>, std::shared_ptr<PendingCall>)>
          handler);

  // The session whose token the call carries, if the call came from that session's process;
  // else UNAUTHENTICATED.
  absl::StatusOr<std::shared_ptr<const Session>> Authenticate(
      grpc::CallbackServerContext* ctx) const;
  metrics::Metrics* metrics() const { return metrics_; }

 private:
  SessionRegistry* const sessions_;
  metrics::Metrics* const metrics_;
  GrpcConnections* const connections_;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_RPC_H_
