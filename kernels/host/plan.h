// Validation of a host collective's arguments and the staging layout of its tensors in the
// data regions (rules: collectives.h). Internal to kernels/host.
//
//   ASSIGN_OR_RETURN(StagingPlan plan, PlanCollective(view, CollectiveOp::kAllGather, ts));
#ifndef COMMD_KERNELS_HOST_PLAN_H_
#define COMMD_KERNELS_HOST_PLAN_H_

#include <cstddef>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/include/commd/collective_op.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"

namespace commd::kernels {

// Which collective: the SDK's one enum (kAllReduce, kAllGather, kReduceScatter, kBroadcast
// and kAllToAll here). Its values are part of the call check's shape word (4 bits;
// kernels/signal_layout.h). "all_reduce", "all_gather", "reduce_scatter", "broadcast",
// "all_to_all". A string_view with its length known, so that the success path, which hands
// it on for messages it rarely builds, takes no strlen.
absl::string_view CollectiveName(CollectiveOp kind);

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

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_PLAN_H_
