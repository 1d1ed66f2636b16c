// gRPC Health service (proto/commd/v1/health.proto): the watchdog's view of each group, and
// aborts on request.
//
// A session sees and aborts its own job's groups. Naming another job, or all jobs, needs uid 0
// or the admin group; to anyone else another job's groups do not exist (NOT_FOUND). With a
// cluster, GetHealth's `cluster` adds every node's published view of the job's groups.
#ifndef COMMD_DAEMON_WATCHDOG_HEALTH_SERVICE_H_
#define COMMD_DAEMON_WATCHDOG_HEALTH_SERVICE_H_

#include <set>

#include "absl/synchronization/mutex.h"
#include "commd/v1/health.grpc.pb.h"
#include "daemon/server/rpc.h"
#include "daemon/watchdog/watchdog.h"

namespace commd::watchdog {

class HealthService final : public v1::Health::CallbackService {
 public:
  // `cluster` (null without a cluster) serves GetHealth's `cluster` views.
  HealthService(server::RpcContext* rpc, Watchdog* watchdog, ClusterViews* cluster = nullptr)
      : rpc_(rpc), watchdog_(watchdog), cluster_(cluster) {}

  grpc::ServerUnaryReactor* GetHealth(grpc::CallbackServerContext* ctx,
                                      const v1::GetHealthRequest* request,
                                      v1::GetHealthResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;

 private:
  server::RpcContext* const rpc_;
  Watchdog* const watchdog_;
  ClusterViews* const cluster_;
  // Uids with a read of the cluster's views in flight: one each, so that what the daemon
  // buffers for such reads is bounded per uid (each answer by the etcd client's receive limit).
  absl::Mutex mu_;
  std::set<uint32_t> reading_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::watchdog

#endif  // COMMD_DAEMON_WATCHDOG_HEALTH_SERVICE_H_
