#include "daemon/server/rpc.h"

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/runtime_dir.h"

namespace commd::server {

grpc::ServerUnaryReactor* RpcContext::Serve(
    grpc::CallbackServerContext* ctx, absl::string_view method,
    absl::FunctionRef<absl::Status(const Session&)> handler) {
  const absl::Time start = absl::Now();
  absl::Status status;
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kSessionMetadataKey);
  const absl::string_view token = it == metadata.end()
                                      ? absl::string_view()
                                      : absl::string_view(it->second.data(), it->second.size());
  auto session = sessions_->Authenticate(token);
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
