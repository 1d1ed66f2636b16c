// Element types and reductions of the SDK's collectives and recorder: commd::DataType and
// commd::ReduceOp, rows of commd/vocabulary.h, which this header re-exports.
//
//   commd::DataTypeSize(commd::DataType::kBFloat16)      // 2
//   commd::IsCollectiveType(commd::DataType::kFloat8E4M3)  // false: recordable, not reducible
//
// Every DataType can describe a recorded tensor (Recorder::Begin); the collectives take the
// types IsCollectiveType names and refuse the others with INVALID_ARGUMENT.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_TYPES_H_
#define COMMD_CLIENT_INCLUDE_COMMD_TYPES_H_

#include "commd/vocabulary.h"  // IWYU pragma: export

#endif  // COMMD_CLIENT_INCLUDE_COMMD_TYPES_H_
