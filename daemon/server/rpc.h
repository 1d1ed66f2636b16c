// What every gRPC handler does around its own work: find the caller's session from the
// "commd-session" metadata, time the call, count errors, and convert the status once.
//
//   return rpc_->Serve(ctx, "GetStatus", [&](const Session& s) -> absl::Status { ... });
//
// Handlers run on gRPC's callback threads and must not block for long; thread-safe.
#ifndef COMMD_DAEMON_SERVER_RPC_H_
#define COMMD_DAEMON_SERVER_RPC_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/sessions.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace commd::server {

class RpcContext {
 public:
  RpcContext(SessionRegistry* sessions, metrics::Metrics* metrics)
      : sessions_(sessions), metrics_(metrics) {}

  // Authenticates, runs `handler`, records metrics, and finishes the call.
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, absl::string_view method,
                                  absl::FunctionRef<absl::Status(const Session&)> handler);

 private:
  SessionRegistry* const sessions_;
  metrics::Metrics* const metrics_;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_RPC_H_
