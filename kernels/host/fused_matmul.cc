#include "kernels/host/fused_matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "kernels/float16.h"
#include "kernels/host/barrier.h"
#include "kernels/host/call_check.h"
#include "kernels/host/element_loops.h"

namespace commd::kernels {
namespace {

constexpr const char* kAllGatherMatmulName = "all_gather_matmul";
constexpr const char* kMatmulReduceScatterName = "matmul_reduce_scatter";
// Rows of a 16-bit A are converted to fp32 this many bytes at a time (half of a 512 KiB L2),
// and multiplied while they are in cache.
constexpr size_t kBlockBytes = size_t{256} << 10;
constexpr size_t kScaleAlign = 64;

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Per-thread fp32 work areas, reused across calls (no allocation once warm): one per B (a
// 16-bit B converted once per call), a block of A's rows and a block of results.
enum Scratch : size_t { kABlock = kMaxMatmulBs, kCBlock, kScratchCount };
float* ScratchFloats(size_t which, size_t n) {
  thread_local std::vector<float> areas[kScratchCount];
  std::vector<float>& v = areas[which];
  if (v.size() < n) v.resize(n);
  return v.data();
}

void ToFloat(DataType t, const std::byte* src, float* dst, size_t n) {
  if (t == DataType::kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if (t == DataType::kFloat16) {
    const auto* h = reinterpret_cast<const Half*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(h[i]);
  } else {
    const auto* b = reinterpret_cast<const BFloat16*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(b[i]);
  }
}

void FromFloat(DataType t, const float* src, std::byte* dst, size_t n) {
  if (t == DataType::kFloat32) {
    if (reinterpret_cast<const std::byte*>(src) != dst) std::memcpy(dst, src, n * sizeof(float));
  } else if (t == DataType::kFloat16) {
    auto* h = reinterpret_cast<Half*>(dst);
    for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(src[i]);
  } else {
    auto* b = reinterpret_cast<BFloat16*>(dst);
    for (size_t i = 0; i < n; ++i) b[i] = FloatToBFloat16(src[i]);
  }
}

// c (rows x n, fp32) = a (rows x k, fp32) @ b (k x n, fp32), then the scales.
void Gemm(const float* a, size_t rows, size_t k, const float* b, size_t n, const float* row_scale,
          const float* col_scale, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
              static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(k), b,
              static_cast<int>(n), 0.0f, c, static_cast<int>(n));
  if (row_scale == nullptr && col_scale == nullptr) return;
  for (size_t i = 0; i < rows; ++i) {
    const float rs = row_scale != nullptr ? row_scale[i] : 1.0f;
    float* row = c + i * n;
    if (col_scale == nullptr) {
      for (size_t j = 0; j < n; ++j) row[j] *= rs;
    } else {
      for (size_t j = 0; j < n; ++j) row[j] *= rs * col_scale[j];
    }
  }
}

// out (rows x n, type t) = a (rows x k, type t) @ b32 (fp32), scaled. fp32 goes straight
// through sgemm; 16-bit rows are converted and multiplied a cache-sized block at a time.
// `out32` (when not null) receives fp32 results instead of `out` (a partial product).
void MultiplyRows(DataType t, const std::byte* a, size_t rows, size_t k, const float* b32, size_t n,
                  const float* row_scale, const float* col_scale, std::byte* out, float* out32) {
  if (t == DataType::kFloat32) {
    float* c = out32 != nullptr ? out32 : reinterpret_cast<float*>(out);
    Gemm(reinterpret_cast<const float*>(a), rows, k, b32, n, row_scale, col_scale, c);
    return;
  }
  const size_t es = DataTypeSize(t);
  const size_t block = std::max<size_t>(1, kBlockBytes / (k * sizeof(float)));
  float* a32 = ScratchFloats(kABlock, std::min(block, rows) * k);
  float* c32 = out32 != nullptr ? nullptr : ScratchFloats(kCBlock, std::min(block, rows) * n);
  for (size_t r = 0; r < rows; r += block) {
    const size_t m = std::min(block, rows - r);
    ToFloat(t, a + r * k * es, a32, m * k);
    float* c = out32 != nullptr ? out32 + r * n : c32;
    Gemm(a32, m, k, b32, n, row_scale != nullptr ? row_scale + r : nullptr, col_scale, c);
    if (out32 == nullptr) FromFloat(t, c, out + r * n * es, m * n);
  }
}

// B number `i` as fp32: the caller's memory for fp32, else converted once per call.
const float* BAsFloat(size_t i, DataType t, const void* b, size_t k, size_t n) {
  if (t == DataType::kFloat32) return static_cast<const float*>(b);
  float* b32 = ScratchFloats(i, k * n);
  ToFloat(t, static_cast<const std::byte*>(b), b32, k * n);
  return b32;
}

absl::Status CheckDims(const char* name, DataType t, size_t rows, size_t k) {
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": data type ", DataTypeName(t),
                                                   " is not one of float32, float16, bfloat16"));
  }
  // sgemm takes int dimensions.
  constexpr size_t kMaxDim = INT32_MAX;
  if (rows == 0 || k == 0 || rows > kMaxDim || k > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": rows ", rows, " and k ", k, " must be in [1, ", kMaxDim, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckB(const char* name, size_t i, const MatmulB& b) {
  if (b.data == nullptr || b.out == nullptr || b.n == 0 || b.n > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": B ", i, " needs data and out (non-null) and n in [1, ", INT32_MAX, "]; got n ",
        b.n, b.data == nullptr ? ", null data" : "", b.out == nullptr ? ", null out" : ""));
  }
  return absl::OkStatus();
}

absl::Status NoRoom(const char* name, size_t need, size_t have, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what, " need ", need,
                                                 " bytes of the symmetric buffer; it has ", have,
                                                 " per rank"));
}

// What the call check compares beyond kind, count and type: the shape and the scales.
uint64_t Digest(uint64_t tag, size_t k, absl::Span<const MatmulB> bs, bool row_scale) {
  uint64_t d = tag * 1000003u + k;
  for (const MatmulB& b : bs) d = d * 31 + b.n * 2 + (b.col_scale != nullptr ? 1 : 0);
  return d * 2 + (row_scale ? 1 : 0);
}

// The call check, once the caller has waited for every peer: on a mismatch every rank runs
// the closing barrier and fails with the same verdict, so that no rank leaves (and reuses its
// region) while a peer may still read or write it.
absl::Status CheckAfterWaits(const HostExchange& x, CollectiveOp kind, const char* name,
                             CollectiveResult* result) {
  if (absl::Status agreed = CheckCalls(x, kind, result); !agreed.ok()) {
    RETURN_IF_ERROR(HostBarrier(x.view(), name));
    return agreed;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllGatherMatmul(const HostCommView& view, const AllGatherMatmulArgs& args,
                             NanCheck nan_check, CollectiveResult* result) {
  const char* name = kAllGatherMatmulName;
  RETURN_IF_ERROR(ValidateHostCommView(view));
  RETURN_IF_ERROR(CheckDims(name, args.dtype, args.rows, args.k));
  if (args.bs.empty() || args.bs.size() > kMaxMatmulBs) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", args.bs.size(), " Bs (allowed: 1 to ", kMaxMatmulBs, ")"));
  }
  for (size_t i = 0; i < args.bs.size(); ++i) RETURN_IF_ERROR(CheckB(name, i, args.bs[i]));
  const size_t es = DataTypeSize(args.dtype);
  const size_t shard_elems = args.rows * args.k;
  if (args.k > SIZE_MAX / es / args.rows) return NoRoom(name, SIZE_MAX, view.data_bytes, "A");
  const size_t scale_at = AlignUp(shard_elems * es, kScaleAlign);
  const size_t need =
      args.row_scale != nullptr ? scale_at + args.rows * sizeof(float) : shard_elems * es;
  if (need > view.data_bytes) {
    return NoRoom(name, need, view.data_bytes,
                  args.row_scale != nullptr ? "the A shard and its row scales" : "the A shard");
  }
  RETURN_IF_ERROR(CheckNotAborted(view, name));
  if (result != nullptr) *result = CollectiveResult{};

  std::byte* own = view.data[view.rank];
  const uint64_t bad = CopyIn(args.dtype, own, own, shard_elems, nan_check);
  if (result != nullptr) result->nonfinite_count = bad;
  if (args.row_scale != nullptr) {
    std::memcpy(own + scale_at, args.row_scale, args.rows * sizeof(float));
  }
  const TensorArgs shard{own, args.gathered, shard_elems, args.dtype};
  HostExchange ready(view, name);  // this shard and its scales are ready
  ready.Send(MakeCallWords({.kind = CollectiveOp::kAllGather,
                            .tensors = absl::MakeConstSpan(&shard, 1),
                            .staging = Digest(1, args.k, args.bs, args.row_scale)},
                           bad),
             0);

  const float* b32[kMaxMatmulBs];
  for (size_t i = 0; i < args.bs.size(); ++i) {
    b32[i] = BAsFloat(i, args.dtype, args.bs[i].data, args.k, args.bs[i].n);
  }
  auto multiply = [&](int p) {
    const std::byte* a = view.data[p];
    const float* scale =
        args.row_scale != nullptr ? reinterpret_cast<const float*>(a + scale_at) : nullptr;
    for (size_t i = 0; i < args.bs.size(); ++i) {
      const MatmulB& b = args.bs[i];
      std::byte* out =
          static_cast<std::byte*>(b.out) + static_cast<size_t>(p) * args.rows * b.n * es;
      MultiplyRows(args.dtype, a, args.rows, args.k, b32[i], b.n, scale, b.col_scale, out, nullptr);
    }
    if (args.gathered != nullptr) {
      std::memcpy(
          static_cast<std::byte*>(args.gathered) + static_cast<size_t>(p) * shard_elems * es, a,
          shard_elems * es);
    }
  };

  if (view.world_size == 1) {
    multiply(0);
    return CheckCalls(ready, CollectiveOp::kAllGather, result);  // the NaN finding
  }
  multiply(view.rank);  // overlaps the peers' arrival
  for (int i = 1; i < view.world_size; ++i) {
    const int p = (view.rank + i) % view.world_size;
    RETURN_IF_ERROR(ready.WaitFor(p));
    multiply(p);
  }
  RETURN_IF_ERROR(CheckAfterWaits(ready, CollectiveOp::kAllGather, name, result));
  // No shard changes until every rank has read them all.
  return HostBarrier(view, name);
}

absl::Status MatmulReduceScatter(const HostCommView& view, const MatmulReduceScatterArgs& args,
                                 NanCheck nan_check, CollectiveResult* result) {
  const char* name = kMatmulReduceScatterName;
  RETURN_IF_ERROR(ValidateHostCommView(view));
  RETURN_IF_ERROR(CheckDims(name, args.dtype, args.rows, args.k));
  if (args.a == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": A is null"));
  RETURN_IF_ERROR(CheckB(name, 0, args.b));
  if (args.op != ReduceOp::kSum && args.op != ReduceOp::kAvg) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": reduce op ", ReduceOpName(args.op), " is not one of sum, avg"));
  }
  const auto w = static_cast<size_t>(view.world_size);
  if (args.rows % w != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": A's ", args.rows,
                                                   " rows are not divisible by the world size ", w,
                                                   " (allowed: a multiple of ", w, ")"));
  }
  const size_t chunk = args.rows / w;  // rows each destination receives
  const size_t n = args.b.n;
  if (n > view.data_bytes / sizeof(float) / args.rows) {
    return NoRoom(name, args.rows * n * sizeof(float), view.data_bytes,
                  "the fp32 partial products (rows x n x 4)");
  }
  RETURN_IF_ERROR(CheckNotAborted(view, name));
  if (result != nullptr) *result = CollectiveResult{};

  const size_t es = DataTypeSize(args.dtype);
  const auto* a = static_cast<const std::byte*>(args.a);
  // A scan in place (dst == src: nothing is written).
  const uint64_t bad =
      CopyIn(args.dtype, a, const_cast<std::byte*>(a), args.rows * args.k, nan_check);
  if (result != nullptr) result->nonfinite_count = bad;
  const TensorArgs t{args.a, args.b.out, chunk * n, args.dtype};
  HostExchange entered(view, name);
  entered.Send(MakeCallWords({.kind = CollectiveOp::kReduceScatter,
                              .op = args.op,
                              .tensors = absl::MakeConstSpan(&t, 1),
                              .staging = Digest(2, args.k, absl::MakeConstSpan(&args.b, 1),
                                                args.row_scale != nullptr)},
                             bad),
               0);
  const float* b32 = BAsFloat(0, args.dtype, args.b.data, args.k, n);
  const size_t slot_floats = chunk * n;
  // Destination d's rows of A @ B, as fp32, into slot `rank` of d's data region.
  auto multiply_for = [&](int d) {
    const size_t first = static_cast<size_t>(d) * chunk;
    float* slot =
        reinterpret_cast<float*>(view.data[d]) + static_cast<size_t>(view.rank) * slot_floats;
    MultiplyRows(args.dtype, a + first * args.k * es, chunk, args.k, b32, n,
                 args.row_scale != nullptr ? args.row_scale + first : nullptr, args.b.col_scale,
                 nullptr, slot);
  };

  if (view.world_size > 1) {
    // A destination's region is free once its message is here (it sends only after it
    // finished reading it in its previous call). Peers in ring order, this rank's own rows
    // last.
    for (int i = 1; i <= view.world_size; ++i) {
      const int d = (view.rank + i) % view.world_size;
      if (d != view.rank) RETURN_IF_ERROR(entered.WaitFor(d));
      multiply_for(d);
    }
    RETURN_IF_ERROR(CheckAfterWaits(entered, CollectiveOp::kReduceScatter, name, result));
    RETURN_IF_ERROR(HostBarrier(view, name));  // every partial product is in place
  } else {
    multiply_for(0);
    RETURN_IF_ERROR(CheckCalls(entered, CollectiveOp::kReduceScatter, result));  // the NaN finding
  }
  // Reduce this rank's slots in rank order. No closing barrier: a peer writes into this
  // region again only after this rank arrives in the next call.
  const std::byte* srcs[kMaxWorldSize];
  for (size_t p = 0; p < w; ++p) {
    srcs[p] = view.data[view.rank] + p * slot_floats * sizeof(float);
  }
  auto* out = static_cast<std::byte*>(args.b.out);
  if (args.dtype == DataType::kFloat32) {
    ReduceInto(DataType::kFloat32, args.op, srcs, view.world_size, 0, slot_floats, out,
               view.world_size);
    return absl::OkStatus();
  }
  float* sum = ScratchFloats(kCBlock, slot_floats);
  ReduceInto(DataType::kFloat32, args.op, srcs, view.world_size, 0, slot_floats,
             reinterpret_cast<std::byte*>(sum), view.world_size);
  FromFloat(args.dtype, sum, out, slot_floats);
  return absl::OkStatus();
}

}  // namespace commd::kernels
