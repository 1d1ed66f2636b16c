// gRPC Recorder service (proto/commd/v1/recorder.proto): dumps on request.
#ifndef COMMD_DAEMON_RECORDER_RECORDER_SERVICE_H_
#define COMMD_DAEMON_RECORDER_RECORDER_SERVICE_H_

#include "commd/v1/recorder.grpc.pb.h"
#include "daemon/groups/group_registry.h"
#include "daemon/recorder/dumper.h"
#include "daemon/server/rpc.h"

namespace commd::recorder {

class RecorderService final : public v1::Recorder::CallbackService {
 public:
  RecorderService(server::RpcContext* rpc, groups::GroupRegistry* groups, Dumper* dumper)
      : rpc_(rpc), groups_(groups), dumper_(dumper) {}

  grpc::ServerUnaryReactor* Dump(grpc::CallbackServerContext* ctx, const v1::DumpRequest* request,
                                 v1::DumpResponse* response) override;

 private:
  server::RpcContext* const rpc_;
  groups::GroupRegistry* const groups_;
  Dumper* const dumper_;
};

}  // namespace commd::recorder

#endif  // COMMD_DAEMON_RECORDER_RECORDER_SERVICE_H_
