// Element types, reductions and algorithm choices of the collectives in kernels/.
//
//   const size_t bytes = count * commd::DataTypeSize(DataType::kBFloat16);
//   RETURN_IF_ERROR(commd::kernels::CheckCollectiveType(dtype));
//
// DataType and ReduceOp are the vocabulary's (commd/vocabulary.h), the SDK's own enums. The
// kernels take the types flagged kCollectiveType (IsCollectiveType) and refuse the others.
#ifndef COMMD_KERNELS_TYPES_H_
#define COMMD_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "commd/vocabulary.h"
#include "kernels/host_device.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace commd::kernels {

// One-shot: every rank reads every rank's whole input and reduces it (one pass, latency
// bound; best for small messages). Two-shot: reduce-scatter then all-gather (each rank
// reduces 1/world of the data; best for large messages). See ChooseAllReduceAlgorithm.
enum class Algorithm : int { kOneShot = 0, kTwoShot = 1 };

// Whether a collective counts the non-finite (NaN, +-Inf) values of this rank's input while
// copying it in. Ignored for integer types.
enum class NanCheck : int { kOff = 0, kOn = 1 };

COMMD_HOST_DEVICE constexpr bool IsValid(Algorithm a) {
  return a == Algorithm::kOneShot || a == Algorithm::kTwoShot;
}

#ifndef __CUDACC__
// OK for a type the kernels take, else INVALID_ARGUMENT "data type float8_e4m3fn (10) is not
// one of float32, float16, ..." (the list from the vocabulary's rows).
absl::Status CheckCollectiveType(DataType t);
// OK for a reduce op of the vocabulary defined on `t` (ReduceOpApplies; any op when `t` is not
// a collective type, which CheckCollectiveType refuses), else INVALID_ARGUMENT "reduce op 9 is
// not one of sum, avg, min, max, product, band, bor, bxor" or "reduce op bxor is not defined on
// float32; allowed on float32: sum, avg, min, max, product".
absl::Status CheckReduceOp(ReduceOp op, DataType t);
#endif

// "one_shot", ...; "?" for a value outside the enum.
const char* AlgorithmName(Algorithm a);
// The algorithm as error messages name it, saying what it does: "one-shot (every rank reads
// all peers' inputs)", "two-shot (reduce-scatter, then all-gather)"; docs/operations.md
// ("All-reduce algorithms") says when each is chosen. "?" outside the enum.
const char* AlgorithmWords(Algorithm a);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_TYPES_H_
