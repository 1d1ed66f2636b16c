// Element types and reductions of the SDK's collectives and recorder.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_TYPES_H_
#define COMMD_CLIENT_INCLUDE_COMMD_TYPES_H_

namespace commd {

enum class DataType { kFloat32, kFloat16, kBFloat16, kInt32, kInt64 };
enum class ReduceOp { kSum, kAvg, kMin, kMax };

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_TYPES_H_
