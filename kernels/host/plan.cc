#include "kernels/host/plan.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "kernels/signal_layout.h"

namespace commd::kernels {
namespace {

constexpr size_t kStagingAlignment = 64;

struct ByteRange {
  uintptr_t begin;
  uintptr_t end;  // exclusive
};

bool Overlaps(ByteRange a, ByteRange b) { return a.begin < b.end && b.begin < a.end; }

ByteRange RangeOf(const void* p, size_t bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  return ByteRange{b, b + bytes};
}

// The rank whose data region `r` overlaps, or -1.
int OverlappedRegion(const HostCommView& view, ByteRange r) {
  for (int p = 0; p < view.world_size; ++p) {
    if (Overlaps(r, RangeOf(view.data[p], view.data_bytes))) return p;
  }
  return -1;
}

bool Inside(ByteRange inner, ByteRange outer) {
  return inner.begin >= outer.begin && inner.end <= outer.end;
}

// INVALID_ARGUMENT about one tensor, "all_reduce tensor 0 (count 9 x float32): <parts>".
// Only ever called on a failed check: the success path builds no label and allocates nothing.
template <typename... Parts>
ABSL_ATTRIBUTE_NOINLINE absl::Status TensorError(CollectiveOp kind, size_t index,
                                                 const TensorArgs& t, const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(CollectiveName(kind), " tensor ", index,
                                                 " (count ", t.count, " x ", DataTypeName(t.dtype),
                                                 "): ", parts...));
}

// Elements of the input and of the output of one tensor, or an error on overflow.
absl::Status TensorSizes(const HostCommView& view, CollectiveOp kind, size_t index,
                         const TensorArgs& t, size_t* in_bytes, size_t* out_bytes) {
  const size_t es = DataTypeSize(t.dtype);
  const size_t w = static_cast<size_t>(view.world_size);
  size_t bytes = 0, wide = 0;
  if (__builtin_mul_overflow(t.count, es, &bytes) || __builtin_mul_overflow(bytes, w, &wide)) {
    return TensorError(kind, index, t, "count ", t.count,
                       " overflows the byte size; allowed: count x element size x world size "
                       "< 2^64");
  }
  const bool all_to_all = kind == CollectiveOp::kAllToAll;
  *in_bytes = kind == CollectiveOp::kReduceScatter || all_to_all ? wide : bytes;
  *out_bytes = kind == CollectiveOp::kAllGather || all_to_all ? wide : bytes;
  return absl::OkStatus();
}

absl::Status CheckPointer(CollectiveOp kind, size_t index, const TensorArgs& t, const char* which,
                          const void* p, size_t bytes) {
  if (p == nullptr) {
    return TensorError(kind, index, t, which, " is null; allowed: non-null for count > 0");
  }
  const size_t es = DataTypeSize(t.dtype);
  if (reinterpret_cast<uintptr_t>(p) % es != 0) {
    return TensorError(kind, index, t, which, " 0x", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                       " is not aligned to the element size ", es);
  }
  return absl::OkStatus();
}

// "all_reduce tensor 0: data type float8_e4m3fn (10) is not one of float32, ...", or OK.
absl::Status CheckTensorType(CollectiveOp kind, size_t index, DataType t) {
  absl::Status s = CheckCollectiveType(t);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat(CollectiveName(kind), " tensor ", index, ": ", s.message()));
}

// Checks one tensor and fills everything but its offset.
absl::StatusOr<StagedTensor> CheckTensor(const HostCommView& view, CollectiveOp kind, size_t index,
                                         const TensorArgs& t) {
  RETURN_IF_ERROR(CheckTensorType(kind, index, t.dtype));
  size_t in_bytes = 0, out_bytes = 0;
  RETURN_IF_ERROR(TensorSizes(view, kind, index, t, &in_bytes, &out_bytes));
  if (in_bytes > view.data_bytes) {
    return TensorError(kind, index, t, "input of ", in_bytes, " bytes exceeds the data region of ",
                       view.data_bytes, " bytes per rank");
  }
  RETURN_IF_ERROR(CheckPointer(kind, index, t, "input", t.input, in_bytes));
  RETURN_IF_ERROR(CheckPointer(kind, index, t, "output", t.output, out_bytes));
  const ByteRange own = RangeOf(view.data[view.rank], view.data_bytes);
  const ByteRange in = RangeOf(t.input, in_bytes);
  const ByteRange out = RangeOf(t.output, out_bytes);
  const bool in_place = Inside(in, own);
  if (!in_place) {
    if (const int p = OverlappedRegion(view, in); p >= 0) {
      return TensorError(kind, index, t, "input overlaps rank ", p,
                         "'s data region but is not inside rank ", view.rank,
                         "'s own; allowed: inside the own data region or outside all of them");
    }
  }
  // Their output may be the in-place input itself: all-reduce overwrites it only after every
  // peer has read it (one-shot keeps its results aside until then), and a broadcast writes only
  // the buffers of ranks other than the root, which no peer reads.
  const bool may_be_input = kind == CollectiveOp::kAllReduce || kind == CollectiveOp::kBroadcast;
  const bool out_is_input = in_place && may_be_input && t.output == t.input;
  if (!out_is_input) {
    if (const int p = OverlappedRegion(view, out); p >= 0) {
      return TensorError(kind, index, t, "output overlaps rank ", p, "'s data region; allowed: ",
                         may_be_input ? "the in-place input itself or " : "",
                         "memory outside every data region");
    }
  }
  StagedTensor s{};
  s.input = static_cast<const std::byte*>(t.input);
  s.output = static_cast<std::byte*>(t.output);
  s.count = t.count;
  s.dtype = t.dtype;
  s.element_size = DataTypeSize(t.dtype);
  s.staged_count = in_bytes / s.element_size;
  s.in_place = in_place;
  if (in_place) s.offset = static_cast<size_t>(in.begin - own.begin);
  return s;
}

// Outside inputs are packed from offset 0; in-place ones must not overlap each other.
absl::Status AssignOffsets(const HostCommView& view, CollectiveOp kind, StagingPlan* plan) {
  if (plan->in_place) {
    if (plan->tensors.size() < 2) return absl::OkStatus();
    absl::InlinedVector<std::pair<size_t, size_t>, 4> ranges;
    for (const StagedTensor& t : plan->tensors) {
      ranges.emplace_back(t.offset, t.offset + t.staged_count * t.element_size);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) {
        return absl::InvalidArgumentError(
            absl::StrCat(CollectiveName(kind), ": in-place inputs overlap at data offset ",
                         ranges[i].first, "; allowed: disjoint tensors"));
      }
    }
    return absl::OkStatus();
  }
  size_t offset = 0;
  for (StagedTensor& t : plan->tensors) {
    t.offset = offset;
    const size_t end = offset + t.staged_count * t.element_size;
    if (end > view.data_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveName(kind), ": ", plan->tensors.size(), " tensors need ", end,
          "+ bytes of staging; the data region holds ", view.data_bytes, " bytes per rank"));
    }
    offset = AlignUp(end, kStagingAlignment);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StagingPlan> PlanCollective(const HostCommView& view, CollectiveOp kind,
                                           absl::Span<const TensorArgs> tensors) {
  RETURN_IF_ERROR(ValidateHostCommView(view));
  StagingPlan plan;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].count == 0) {
      RETURN_IF_ERROR(CheckTensorType(kind, i, tensors[i].dtype));
      continue;
    }
    ASSIGN_OR_RETURN(StagedTensor t, CheckTensor(view, kind, i, tensors[i]));
    if (!plan.tensors.empty() && t.in_place != plan.in_place) {
      return absl::InvalidArgumentError(absl::StrCat(
          CollectiveName(kind), " tensor ", i, ": input is ",
          t.in_place ? "in place" : "outside the data region", " but the earlier tensors' are ",
          plan.in_place ? "in place" : "outside", "; allowed: all in place or none"));
    }
    plan.in_place = t.in_place;
    plan.tensors.push_back(t);
  }
  RETURN_IF_ERROR(AssignOffsets(view, kind, &plan));
  return plan;
}

}  // namespace commd::kernels
