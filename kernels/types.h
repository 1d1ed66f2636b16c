// Element types, reductions and algorithm choices of the collectives in kernels/.
//
//   const size_t bytes = count * commd::kernels::DataTypeSize(DataType::kBFloat16);
//
// The enumerators have the names and values of the SDK's public `commd::DataType` and
// `commd::ReduceOp` (client/include/commd/types.h), so the SDK converts with a static_cast;
// element_ops_test.cc asserts that the two stay in step.
#ifndef COMMD_KERNELS_TYPES_H_
#define COMMD_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "kernels/host_device.h"

namespace commd::kernels {

enum class DataType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kInt32 = 3, kInt64 = 4 };
inline constexpr int kDataTypeCount = 5;

// kAvg is the sum divided by the world size (integers: truncated toward zero).
enum class ReduceOp : int { kSum = 0, kAvg = 1, kMin = 2, kMax = 3 };
inline constexpr int kReduceOpCount = 4;

// One-shot: every rank reads every rank's whole input and reduces it (one pass, latency
// bound; best for small messages). Two-shot: reduce-scatter then all-gather (each rank
// reduces 1/world of the data; best for large messages). See ChooseAllReduceAlgorithm.
enum class Algorithm : int { kOneShot = 0, kTwoShot = 1 };

// Whether a collective counts the non-finite (NaN, +-Inf) values of this rank's input while
// copying it in. Ignored for integer types.
enum class NanCheck : int { kOff = 0, kOn = 1 };

COMMD_HOST_DEVICE constexpr bool IsValid(DataType t) {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) < kDataTypeCount;
}
COMMD_HOST_DEVICE constexpr bool IsValid(ReduceOp op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) < kReduceOpCount;
}
COMMD_HOST_DEVICE constexpr bool IsValid(Algorithm a) {
  return a == Algorithm::kOneShot || a == Algorithm::kTwoShot;
}

// Bytes per element; 0 for a value outside the enum.
COMMD_HOST_DEVICE constexpr size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt64:
      return 8;
  }
  return 0;
}

COMMD_HOST_DEVICE constexpr bool IsFloatingPoint(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16;
}

// "float32", "sum", "one_shot", ...; "?" for a value outside the enum.
const char* DataTypeName(DataType t);
const char* ReduceOpName(ReduceOp op);
const char* AlgorithmName(Algorithm a);
// The algorithm as error messages name it, saying what it does: "one-shot (every rank reads
// all peers' inputs)", "two-shot (reduce-scatter, then all-gather)"; docs/operations.md
// ("All-reduce algorithms") says when each is chosen. "?" outside the enum.
const char* AlgorithmWords(Algorithm a);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_TYPES_H_
