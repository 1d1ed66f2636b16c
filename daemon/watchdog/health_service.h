// gRPC Health service (proto/commd/v1/health.proto): the watchdog's view of each group, and
// aborts on request.
//
// A session sees and aborts its own job's groups. Naming another job, or all jobs, needs uid 0
// or the admin group; to anyone else another job's groups do not exist (NOT_FOUND).
#ifndef COMMD_DAEMON_WATCHDOG_HEALTH_SERVICE_H_
#define COMMD_DAEMON_WATCHDOG_HEALTH_SERVICE_H_

#include "commd/v1/health.grpc.pb.h"
#include "daemon/server/rpc.h"
#include "daemon/watchdog/watchdog.h"

namespace commd::watchdog {

class HealthService final : public v1::Health::CallbackService {
 public:
  HealthService(server::RpcContext* rpc, Watchdog* watchdog) : rpc_(rpc), watchdog_(watchdog) {}

  grpc::ServerUnaryReactor* GetHealth(grpc::CallbackServerContext* ctx,
                                      const v1::GetHealthRequest* request,
                                      v1::GetHealthResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;

 private:
  server::RpcContext* const rpc_;
  Watchdog* const watchdog_;
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_HEALTH_SERVICE_H_
