// Validation of a host collective's arguments and the staging layout of its tensors in the
// data regions (rules: collectives.h), and the prepared form of a call that keeps them.
// Internal to kernels/host, but for PreparedCollective, which the SDK keeps per buffer.
//
//   ASSIGN_OR_RETURN(StagingPlan plan, PlanCollective(view, CollectiveOp::kAllGather, ts));
#ifndef COMMD_KERNELS_HOST_PLAN_H_
#define COMMD_KERNELS_HOST_PLAN_H_

#include <cstddef>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "commd/vocabulary.h"
#include "kernels/host/barrier.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd::kernels {

// Which collective: the vocabulary's CollectiveOp (kAllReduce, kAllGather, kReduceScatter,
// kBroadcast and kAllToAll here), named in messages by commd::CollectiveName ("all_reduce").
// Its values are part of the call check's shape word (4 bits; kernels/signal_layout.h).

struct StagedTensor {
  const std::byte* input;
  std::byte* output;
  size_t count;  // elements per rank (TensorArgs::count)
  DataType dtype;
  size_t element_size;
  size_t staged_count;  // elements staged in each data region: input elements
  size_t offset;        // byte offset of the staged input in every rank's data region
  bool in_place;        // the input already is this rank's staged copy
};

struct StagingPlan {
  absl::InlinedVector<StagedTensor, 4> tensors;  // tensors with count > 0
  bool in_place = false;                         // every input in place (else none is)
};

// INVALID_ARGUMENT naming the offending value and the allowed range, before anything is
// touched; the view is validated too.
absl::StatusOr<StagingPlan> PlanCollective(const HostCommView& view, CollectiveOp kind,
                                           absl::Span<const TensorArgs> tensors);

// One call validated against one view, with everything its runs would otherwise re-derive:
// the staging plan, the call words every rank exchanges (their hash covers the staging offsets;
// only the NaN finding is added per run) and whether the inputs travel in the exchange. Made by
// a Prepare function (collectives.h), which validates as the public entries do; run by the
// matching ...Prepared entry. The public entries prepare and run every call; the SDK keeps one
// per buffer and runs it again while the buffer's calls equal the one it was made for.
struct PreparedCollective {
  // The view it was validated against. A run compares its view's fields with these
  // (ViewMatches) and refuses another view: the pointer arrays, not their contents, so a
  // caller that keeps a prepared call must keep the arrays' contents fixed too (the SDK's are
  // per buffer, filled once at mapping).
  std::byte* const* data = nullptr;
  uint32_t* const* pads = nullptr;
  int rank = -1;
  int world_size = 0;
  size_t data_bytes = 0;
  size_t pad_slots = 0;

  CollectiveOp kind = CollectiveOp::kAllReduce;
  ReduceOp op = ReduceOp::kSum;               // all-reduce and reduce-scatter
  Algorithm algorithm = Algorithm::kOneShot;  // all-reduce
  int root = 0;                               // broadcast
  StagingPlan plan;
  CallWords words;       // MakeCallWords(call, 0): no NaN finding
  bool carries = false;  // a one-shot all-reduce whose inputs fit one exchange payload

  bool ViewMatches(const HostCommView& v) const {
    return v.data == data && v.pads == pads && v.rank == rank && v.world_size == world_size &&
           v.data_bytes == data_bytes && v.pad_slots == pad_slots;
  }
};

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_PLAN_H_
