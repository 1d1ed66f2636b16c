// The one place where absl::Status and grpc::Status meet: handlers convert once on the way
// out, the SDK once on the way in.
#ifndef COMMD_COMMON_GRPC_STATUS_H_
#define COMMD_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace commd {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace commd

#endif  // COMMD_COMMON_GRPC_STATUS_H_
