// The SDK's checks of a collective's arguments (collective_checks.h).
#include "client/src/collective_checks.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/src/group_state.h"
#include "common/status_macros.h"
#include "kernels/host/fused_matmul.h"
#include "kernels/types.h"

namespace commd {
namespace {

// Which buffer a message is about: "all-gather input", or "all-reduce" for one buffer.
struct Side {
  const char* words;
  const char* side;  // "" for a collective on one buffer
};
std::string Name(const Side& s) { return absl::StrCat(s.words, *s.side ? " " : "", s.side); }

// Why OptionsValid(o) is false.
}  // namespace

[[gnu::noinline]] absl::Status OptionsError(const CollectiveOptions& o) {
  using N = CollectiveOptions::NanCheck;
  if (o.nan_check < N::kDefault || o.nan_check > N::kSampled) {
    return absl::InvalidArgumentError(
        absl::StrCat("nan_check ", static_cast<int>(o.nan_check),
                     " is not one of default (0), off (1), on (2), sampled (3)"));
  }
  if (o.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(o.timeout),
                     " is negative (allowed: > 0, or 0 for twice the group's timeout)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("nan_sample_period ", o.nan_sample_period,
                                                 " is out of range [", kMinNanSamplePeriod, ", ",
                                                 kMaxNanSamplePeriod, "]"));
}

namespace {

absl::Status CheckOptions(const CollectiveOptions& o) {
  return OptionsValid(o) ? absl::OkStatus() : OptionsError(o);
}

// `elements` of `dtype` at byte `offset` must fit `buf`'s data bytes. `what` names the
// buffer, and `tensor` the coalesced tensor (-1: none).
absl::Status CheckFits(const Side& what, long tensor, const SymmetricBuffer& buf, size_t offset,
                       size_t elements, DataType dtype) {
  const size_t es = DataTypeSize(dtype);
  const size_t size = buf.size();
  if (offset <= size && elements <= (size - offset) / es && offset % es == 0) {
    return absl::OkStatus();
  }
  const std::string name = tensor < 0 ? Name(what) : absl::StrCat(Name(what), " tensor ", tensor);
  if (offset > size || elements > (size - offset) / es) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", elements, " elements of ", es, " bytes at offset ", offset,
                     " do not fit the buffer's ", size, " bytes (allowed: at most ",
                     offset > size ? 0 : (size - offset) / es, " elements)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": offset ", offset, " is not a multiple of the element size ", es));
}

absl::Status CheckOwned(const Side& what, bool owned, const SymmetricBuffer& buf) {
  if (owned) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Name(what), " buffer ", buf.id(),
                                                 " was not allocated by this group for this rank"));
}

// One pointer of a host-memory call: non-null, aligned, outside every rank's part of the
// staging buffer (whose views the kernels read; the kernels would take memory inside this
// rank's part for an in-place input, which these overloads do not mean).
absl::Status CheckHostPointer(const Side& what, const void* p, size_t bytes, size_t es,
                              SymmetricBuffer& staging, int world_size) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(what), " is null (allowed: non-null for count > 0)"));
  }
  if (begin % es != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Name(what), " 0x", absl::Hex(begin),
                                                   " is not aligned to the element size ", es));
  }
  for (int r = 0; r < world_size; ++r) {
    const auto part = reinterpret_cast<uintptr_t>(staging.peer(r));
    if (begin < part + staging.size() && part < begin + bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          Name(what), " [0x", absl::Hex(begin), ", +", bytes, " bytes) overlaps rank ", r,
          "'s part of staging buffer ", staging.id(),
          "; allowed: memory outside the staging buffer (data already in a symmetric buffer "
          "take the SymmetricBuffer overloads)"));
    }
  }
  return absl::OkStatus();
}

// The host-memory overloads: the input fits the staging buffer (and the output, for a group
// spanning nodes, whose results come back through it: `staged_out`), and the pointers.
absl::Status CheckHostMemory(const CollectiveCall& c, const Shape& shape, size_t in_count,
                             size_t out_count, int local_world_size, bool staged_out) {
  SymmetricBuffer& staging = *c.in;
  const size_t es = DataTypeSize(c.dtype);
  const size_t slots = staged_out ? std::max(in_count, out_count) : in_count;
  const size_t capacity = staging.size() / es / slots;
  if (c.count > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": count ", c.count, " x ", DataTypeName(c.dtype),
                     slots > 1 ? absl::StrCat(" x world size ", slots) : "",
                     " does not fit staging buffer ", staging.id(), " of ", staging.size(),
                     " bytes per rank (allowed: count at most ", capacity, ")"));
  }
  if (c.count == 0) return absl::OkStatus();  // a no-op: no memory is read or written
  if (shape.one_buffer()) {  // broadcast and all-reduce: input and output are the one buffer
    const bool one = c.input == c.output;
    RETURN_IF_ERROR(CheckHostPointer({shape.words, one ? "buffer" : "input"}, c.input, c.count * es,
                                     es, staging, local_world_size));
    if (one) return absl::OkStatus();
  } else {
    RETURN_IF_ERROR(CheckHostPointer({shape.words, "input"}, c.input, c.count * in_count * es, es,
                                     staging, local_world_size));
  }
  return CheckHostPointer({shape.words, "output"}, c.output, c.count * out_count * es, es, staging,
                          local_world_size);
}

// The fused matmuls' operands and the room they take in the call's symmetric buffer (the
// kernels check the same again; these messages name the public call).
absl::Status CheckMatmul(const CollectiveCall& c, const Shape& shape, int world_size) {
  const MatmulCall& m = *c.matmul;
  const bool gather = c.kind == CollectiveOp::kAllGatherMatmul;
  constexpr size_t kMaxDim = INT32_MAX;  // sgemm's int dimensions
  if (!IsFloatingPoint(c.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(shape.words, ": data type ",
                                                   DataTypeName(c.dtype),
                                                   " is not one of float32, float16, bfloat16"));
  }
  if (m.rows == 0 || m.k == 0 || m.rows > kMaxDim || m.k > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(shape.words, ": rows ", m.rows, " and k ", m.k,
                                                   " must be in [1, ", kMaxDim, "]"));
  }
  const size_t max_bs = gather ? kernels::kMaxMatmulBs : 1;
  if (m.bs.empty() || m.bs.size() > max_bs) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": ", m.bs.size(), " Bs (allowed: 1 to ", max_bs, ")"));
  }
  for (size_t i = 0; i < m.bs.size(); ++i) {
    const MatmulB& b = m.bs[i];
    if (b.data == nullptr || b.out == nullptr || b.n == 0 || b.n > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape.words, ": B ", i, " needs non-null data and out and n in [1, ",
                       kMaxDim, "]; got n ", b.n, b.data == nullptr ? ", null data" : "",
                       b.out == nullptr ? ", null out" : ""));
    }
  }
  const size_t es = DataTypeSize(c.dtype), size = c.in->size();
  const auto w = static_cast<size_t>(world_size);
  if (gather) {
    const bool fits = m.k <= size / es / m.rows;
    const size_t shard = fits ? m.rows * m.k * es : SIZE_MAX;
    const size_t need =
        m.row_scale == nullptr || !fits ? shard : (shard + 63) / 64 * 64 + m.rows * sizeof(float);
    if (!fits || need > size) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape.words, ": a shard of ", m.rows, " x ", m.k, " ", DataTypeName(c.dtype),
                       m.row_scale != nullptr ? " and its row scales" : "", " does not fit buffer ",
                       c.in->id(), " of ", size, " bytes per rank"));
    }
    return absl::OkStatus();
  }
  if (m.a == nullptr) return absl::InvalidArgumentError(absl::StrCat(shape.words, ": A is null"));
  if (m.rows % w != 0) {
    return absl::InvalidArgumentError(absl::StrCat(shape.words, ": A's ", m.rows,
                                                   " rows are not divisible by the world size ", w,
                                                   " (allowed: a multiple of ", w, ")"));
  }
  if (c.op != ReduceOp::kSum && c.op != ReduceOp::kAvg) {
    return absl::InvalidArgumentError(absl::StrCat(
        shape.words, ": reduce op ", static_cast<int>(c.op), " is not one of sum (0), avg (1)"));
  }
  if (m.bs[0].n > size / sizeof(float) / m.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": the float32 partial products of ", m.rows, " x ", m.bs[0].n,
                     " do not fit workspace ", c.in->id(), " of ", size,
                     " bytes per rank (allowed: n at most ", size / sizeof(float) / m.rows, ")"));
  }
  return absl::OkStatus();
}

// The call's buffers and sizes (its options, types and op checked already). `world_size` is
// the group's over every node; `local_world_size` this node's part of it.
absl::Status CheckBuffers(const CollectiveCall& c, const Shape& shape, bool owns_in, bool owns_out,
                          int local_world_size, int world_size) {
  const Side in{shape.words, c.host_memory ? "staging" : shape.one_buffer() ? "" : "input"};
  const Side out{shape.words, "output"};
  RETURN_IF_ERROR(CheckOwned(in, owns_in, *c.in));
  if (!shape.one_buffer() && !c.host_memory) {
    RETURN_IF_ERROR(CheckOwned(out, owns_out, *c.out));
    if (c.in == c.out) {
      return absl::InvalidArgumentError(
          absl::StrCat(shape.words, ": input and output are the same buffer"));
    }
  }
  if (c.matmul != nullptr) return CheckMatmul(c, shape, local_world_size);
  if (c.kind == CollectiveOp::kAllReduceCoalesced) {
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      const CoalescedTensor& t = c.tensors[i];
      RETURN_IF_ERROR(kernels::CheckCollectiveType(t.dtype));
      RETURN_IF_ERROR(kernels::CheckReduceOp(c.op, t.dtype));
      RETURN_IF_ERROR(CheckFits(in, static_cast<long>(i), *c.in, t.offset, t.count, t.dtype));
    }
    return absl::OkStatus();
  }
  if (!shape.typed()) return absl::OkStatus();
  const size_t n = static_cast<size_t>(world_size);
  const size_t in_count = shape.wide_in() ? n : 1, out_count = shape.wide_out() ? n : 1;
  const size_t factor = std::max(in_count, out_count);
  if (c.count > SIZE_MAX / factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        shape.words, ": count ", c.count, " too large (allowed: at most ", SIZE_MAX / factor, ")"));
  }
  if (c.host_memory) {
    return CheckHostMemory(c, shape, in_count, out_count, local_world_size,
                           world_size > local_world_size);
  }
  RETURN_IF_ERROR(CheckFits(in, -1, *c.in, 0, c.count * in_count, c.dtype));
  if (shape.one_buffer()) return absl::OkStatus();
  return CheckFits(out, -1, *c.out, 0, c.count * out_count, c.dtype);
}

}  // namespace

absl::Status CheckCall(const CollectiveCall& c, bool owns_in, bool owns_out, int local_world_size,
                       int world_size) {
  const Shape& shape = ShapeOf(c.kind);
  RETURN_IF_ERROR(CheckOptions(*c.options));
  if (shape.typed() && c.kind != CollectiveOp::kAllReduceCoalesced) {
    RETURN_IF_ERROR(kernels::CheckCollectiveType(c.dtype));
  }
  if (shape.reduces()) RETURN_IF_ERROR(kernels::CheckReduceOp(c.op, c.dtype));
  if (shape.rooted() && (c.root < 0 || c.root >= world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.words, ": root ", c.root, " is out of range [0, ", world_size - 1, "]"));
  }
  return CheckBuffers(c, shape, owns_in, owns_out, local_world_size, world_size);
}

}  // namespace commd
