// The SDK's checks of a collective's arguments, before Group::Run hands a call to its backend:
// options, type and reduce op against the vocabulary's row of the collective (ShapeOf), root,
// buffers (ownership, sizes, host-memory placement) and the fused matmuls' shapes. Each
// failure is INVALID_ARGUMENT naming the value and what is allowed.
//
//   RETURN_IF_ERROR(CheckCall(call, owns_in, owns_out, local_world_size, world_size));
//
// Pure functions of their arguments: no lock, thread-safe.
#ifndef COMMD_CLIENT_SRC_COLLECTIVE_CHECKS_H_
#define COMMD_CLIENT_SRC_COLLECTIVE_CHECKS_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/src/collective_call.h"
#include "commd/group.h"
#include "commd/limits.h"
#include "commd/vocabulary.h"

namespace commd {

// What a collective takes and how its buffers are sized: its row of the vocabulary
// (commd/vocabulary.h).
using Shape = vocabulary::CollectiveRow;
constexpr const Shape& ShapeOf(CollectiveOp kind) { return CollectiveInfo(kind); }

// The options' checks, inline: a call whose argument checks were skipped still pays these
// few comparisons, and builds a message only when one fails (OptionsError).
inline bool OptionsValid(const CollectiveOptions& o) {
  using N = CollectiveOptions::NanCheck;
  return o.nan_check >= N::kDefault && o.nan_check <= N::kSampled &&
         o.timeout >= absl::ZeroDuration() &&
         (o.nan_check != N::kSampled || (o.nan_sample_period >= kMinNanSamplePeriod &&
                                         o.nan_sample_period <= kMaxNanSamplePeriod));
}

// Why OptionsValid(o) is false.
absl::Status OptionsError(const CollectiveOptions& o);

// Every check of `c` on a group of `world_size` ranks, `local_world_size` of them on this
// node; `owns_in` / `owns_out`: the group allocated the buffers for this rank.
absl::Status CheckCall(const CollectiveCall& c, bool owns_in, bool owns_out, int local_world_size,
                       int world_size);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_COLLECTIVE_CHECKS_H_
