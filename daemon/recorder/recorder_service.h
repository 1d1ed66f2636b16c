// gRPC Recorder service (proto/commd/v1/recorder.proto): dumps on request.
#ifndef COMMD_DAEMON_RECORDER_RECORDER_SERVICE_H_
#define COMMD_DAEMON_RECORDER_RECORDER_SERVICE_H_

#include "commd/v1/recorder.grpc.pb.h"
#include "daemon/recorder/group_dumps.h"
#include "daemon/server/rpc.h"

namespace commd::recorder {

class RecorderService final : public v1::Recorder::CallbackService {
 public:
  RecorderService(server::RpcContext* rpc, GroupDumps* dumps) : rpc_(rpc), dumps_(dumps) {}

  grpc::ServerUnaryReactor* Dump(grpc::CallbackServerContext* ctx, const v1::DumpRequest* request,
                                 v1::DumpResponse* response) override;

 private:
  server::RpcContext* const rpc_;
  GroupDumps* const dumps_;
};

}  // namespace commd::recorder

#endif  // COMMD_DAEMON_RECORDER_RECORDER_SERVICE_H_
