// Argument checks and the enqueueing of the fused matmuls' steps (host code; kernels in
// fused_matmul.cu, GEMMs through the cuBLAS table).
#include "kernels/cuda/fused_matmul.h"

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace commd::kernels {
namespace {

using cuda_internal::FusedKernelRuntime;
using cuda_internal::FusedLaunchArgs;

constexpr FusedKernelRuntime kRealRuntime{&cuda_internal::LaunchFusedKernel,
                                          &cuda_internal::PreloadFusedKernels};
const FusedKernelRuntime* g_runtime = &kRealRuntime;

const char* Name(const CudaMatmulArgs& a) {
  return a.gather ? "all_gather_matmul" : "matmul_reduce_scatter";
}

cudaDataType CudaType(DataType t) {
  return t == DataType::kFloat16 ? CUDA_R_16F : t == DataType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The checks of the host kernels (host/fused_matmul.cc), for the same messages on both paths.
absl::Status Check(const CudaCommView& v, const CudaMatmulArgs& a, const FusedMatmulPlan& plan) {
  const char* name = Name(a);
  if (a.dtype != DataType::kFloat32 && a.dtype != DataType::kFloat16 &&
      a.dtype != DataType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": data type ", DataTypeName(a.dtype),
                                                   " is not one of float32, float16, bfloat16"));
  }
  if (a.rows == 0 || a.k == 0 || a.rows > INT32_MAX || a.k > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": rows ", a.rows, " and k ", a.k, " must be in [1, ", INT32_MAX, "]"));
  }
  const size_t max_bs = a.gather ? kMaxMatmulBs : 1;
  if (a.bs.empty() || a.bs.size() > max_bs) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", a.bs.size(), " Bs (allowed: 1 to ", max_bs, ")"));
  }
  for (size_t i = 0; i < a.bs.size(); ++i) {
    const MatmulB& b = a.bs[i];
    if (b.data == nullptr || b.out == nullptr || b.n == 0 || b.n > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": B ", i,
                                                     " needs non-null data and out and n in [1, ",
                                                     INT32_MAX, "]; got n ", b.n));
    }
  }
  const auto w = static_cast<size_t>(v.world_size);
  if (a.gather) {
    const size_t need =
        a.row_scale != nullptr ? plan.scale_offset + a.rows * sizeof(float) : plan.shard_bytes;
    if (a.k > SIZE_MAX / DataTypeSize(a.dtype) / a.rows || need > v.data_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": the A shard", a.row_scale != nullptr ? " and its row scales" : "", " need ",
          need, " bytes of the symmetric buffer; it has ", v.data_bytes, " per rank"));
    }
  } else {
    if (a.a == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": A is null"));
    if (a.rows % w != 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": A's ", a.rows,
                                                     " rows are not divisible by the world size ",
                                                     w, " (allowed: a multiple of ", w, ")"));
    }
    if (a.op != ReduceOp::kSum && a.op != ReduceOp::kAvg) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": reduce op ", ReduceOpName(a.op), " is not one of sum, avg"));
    }
    if (a.bs[0].n > v.data_bytes / sizeof(float) / a.rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": the fp32 partial products (rows x n x 4) need ", a.rows * a.bs[0].n * 4,
          " bytes of the symmetric buffer; it has ", v.data_bytes, " per rank"));
    }
  }
  if (plan.scratch_bytes > 0 && a.scratch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": needs ", plan.scratch_bytes,
                                                   " bytes of fp32 scratch for scaled products"));
  }
  return absl::OkStatus();
}

absl::Status Launch(const CudaCommView& v, const FusedLaunchArgs& a, cudaStream_t s,
                    const char* name) {
  const cudaError_t err = g_runtime->launch(v, a, s);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat(name, ": launch of the ", FusedStepName(a.kind),
                                            " kernel: ", cudaGetErrorName(err), ": ",
                                            cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

// Everything one call's steps need, resolved once.
struct Call {
  const CudaCommView& v;
  const CudaMatmulArgs& a;
  const FusedMatmulShape& shape;
  const FusedMatmulPlan& plan;
};

std::byte* Bytes(const void* p) { return static_cast<std::byte*>(const_cast<void*>(p)); }

// The product of step `st` (cuBLAS, column-major: C^T = B^T A^T, cuda_matmul_plan.h).
absl::Status Gemm(const Call& c, const FusedStep& st, const CublasContext& blas) {
  const MatmulB& b = c.a.bs[static_cast<size_t>(st.b)];
  const void* a_rows;
  void* out;
  size_t m = c.a.rows;
  const cudaDataType out_type = FusedGemmOutputOf(c.shape, st.b) == FusedGemmOutput::kFloat32
                                    ? CUDA_R_32F
                                    : CudaType(c.a.dtype);
  if (c.a.gather) {
    a_rows = c.v.data[st.peer];
    out = FusedGemmToScratch(c.shape, st.b)
              ? c.a.scratch
              : Bytes(b.out) + GatherOutputOffset(c.shape, st.peer, st.b);
  } else {
    m = c.plan.chunk_rows;
    a_rows = Bytes(c.a.a) + ReduceScatterRowsOffset(c.shape, st.peer);
    out = c.v.data[st.peer] + ReduceScatterSlotOffset(c.shape, c.v.rank);
  }
  ASSIGN_OR_RETURN(const CublasGemm g,
                   ToCublas({.m = m, .n = b.n, .k = c.a.k, .lda = c.a.k, .ldb = b.n, .ldc = b.n}));
  const float alpha = 1.0f, beta = 0.0f;
  // CUBLAS_COMPUTE_32F: fp32 accumulation, and no TF32 for fp32 operands (the host path's
  // precision); 16-bit operands may use tensor cores, accumulating in fp32.
  CUBLAS_RETURN_IF_ERROR(
      *blas.api,
      blas.api->gemm_ex(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, g.m, g.n, g.k, &alpha, b.data,
                        CudaType(c.a.dtype), g.lda, a_rows, CudaType(c.a.dtype), g.ldb, &beta, out,
                        out_type, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// The kernel arguments of a kernel step.
FusedLaunchArgs KernelArgs(const Call& c, const FusedStep& st) {
  FusedLaunchArgs k{.kind = st.kind, .dtype = c.a.dtype, .op = c.a.op, .peer = st.peer};
  const std::byte* own = c.v.data[c.v.rank];
  switch (st.kind) {
    case FusedStepKind::kPrepare:
      k.src = c.a.gather ? own : c.a.a;
      k.count = c.a.nan_check == NanCheck::kOn ? c.a.rows * c.a.k : 0;
      if (c.a.gather && c.a.row_scale != nullptr) {
        k.row_scale = c.a.row_scale;
        k.staged_scale = reinterpret_cast<float*>(c.v.data[c.v.rank] + c.plan.scale_offset);
        k.scale_rows = c.a.rows;
      }
      break;
    case FusedStepKind::kScale: {
      const MatmulB& b = c.a.bs[static_cast<size_t>(st.b)];
      k.col_scale = b.col_scale;
      k.cols = b.n;
      if (c.a.gather) {
        void* out = Bytes(b.out) + GatherOutputOffset(c.shape, st.peer, st.b);
        k.src = FusedGemmToScratch(c.shape, st.b) ? c.a.scratch : out;
        k.dst = out;
        k.count = c.a.rows * b.n;
        if (c.a.row_scale != nullptr) {
          k.row_scale = reinterpret_cast<const float*>(c.v.data[st.peer] + c.plan.scale_offset);
        }
      } else {
        k.dtype = DataType::kFloat32;  // the partial product, scaled where it lies
        k.src = k.dst = c.v.data[st.peer] + ReduceScatterSlotOffset(c.shape, c.v.rank);
        k.count = c.plan.chunk_rows * b.n;
        if (c.a.row_scale != nullptr) {
          k.row_scale = c.a.row_scale + static_cast<size_t>(st.peer) * c.plan.chunk_rows;
        }
      }
      break;
    }
    case FusedStepKind::kGather:
      k.src = c.v.data[st.peer];
      k.dst = Bytes(c.a.gathered) + static_cast<size_t>(st.peer) * c.plan.shard_bytes;
      k.count = c.plan.shard_bytes;
      break;
    case FusedStepKind::kReduce:
      k.src = own;
      k.dst = c.a.bs[0].out;
      k.count = c.plan.chunk_rows * c.a.bs[0].n;
      break;
    default:  // arrive, wait, barrier: the view says it all
      break;
  }
  return k;
}

}  // namespace

FusedMatmulShape FusedShapeOf(const CudaCommView& v, const CudaMatmulArgs& a) {
  FusedMatmulShape s{.gather = a.gather,
                     .rank = v.rank,
                     .world_size = v.world_size,
                     .rows = a.rows,
                     .k = a.k,
                     .element_size = DataTypeSize(a.dtype),
                     .row_scale = a.row_scale != nullptr,
                     .gathered = a.gathered != nullptr,
                     .nan_check = a.nan_check == NanCheck::kOn};
  for (size_t i = 0; i < a.bs.size() && i < kFusedMaxBs; ++i) {
    s.ns.push_back(a.bs[i].n);
    if (a.bs[i].col_scale != nullptr) s.col_scale_mask |= 1u << i;
  }
  return s;
}

absl::Status EnqueueFusedMatmul(const CudaCommView& v, const CudaMatmulArgs& a,
                                const CublasContext& blas, cudaStream_t stream, int* enqueued) {
  RETURN_IF_ERROR(ValidateCudaCommView(v));
  if (a.bs.empty() || a.bs.size() > kMaxMatmulBs || a.rows == 0 || a.k == 0 ||
      (!a.gather && a.rows % static_cast<size_t>(v.world_size) != 0)) {
    // Check names it; the plan below needs at least one B and whole chunks.
    return Check(v, a, FusedMatmulPlan{});
  }
  const FusedMatmulShape shape = FusedShapeOf(v, a);
  const FusedMatmulPlan plan = PlanFusedMatmul(shape);
  RETURN_IF_ERROR(Check(v, a, plan));
  const char* name = Name(a);
  const FusedScratchLayout scratch = LayOutFusedScratch(plan.scratch_bytes, blas.workspace_bytes);
  if (blas.workspace_bytes > 0 && a.scratch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": needs ", scratch.total_bytes,
                                                   " bytes of scratch for this stream's cuBLAS "
                                                   "workspace"));
  }
  // The stream, then its own workspace: cublasSetStream has just reset the handle's workspace
  // to cuBLAS's pool, shared by every stream of the handle (PyTorch keeps one workspace per
  // handle and stream for the same reason).
  CUBLAS_RETURN_IF_ERROR(*blas.api, blas.api->set_stream(blas.handle, stream));
  if (blas.workspace_bytes > 0) {
    CUBLAS_RETURN_IF_ERROR(
        *blas.api, blas.api->set_workspace(blas.handle, Bytes(a.scratch) + scratch.workspace_offset,
                                           blas.workspace_bytes));
  }
  const Call c{v, a, shape, plan};
  for (const FusedStep& st : plan.steps) {
    if (st.kind == FusedStepKind::kGemm) {
      RETURN_IF_ERROR(Gemm(c, st, blas));
    } else {
      RETURN_IF_ERROR(Launch(v, KernelArgs(c, st), stream, name));
    }
    ++*enqueued;
  }
  return absl::OkStatus();
}

absl::Status WarmCublas(const CublasContext& blas, void* operands, cudaStream_t stream) {
  constexpr size_t kMatrixBytes = kWarmCublasBytes / 3;
  std::byte* a = Bytes(operands);
  std::byte* b = a + kMatrixBytes;
  std::byte* c = b + kMatrixBytes;
  constexpr int d = kWarmGemmDim;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(*blas.api, blas.api->set_stream(blas.handle, stream));
  for (DataType type : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    for (FusedGemmOutput output : {FusedGemmOutput::kCallType, FusedGemmOutput::kFloat32}) {
      const cudaDataType out_type =
          output == FusedGemmOutput::kFloat32 ? CUDA_R_32F : CudaType(type);
      if (type == DataType::kFloat32 && output == FusedGemmOutput::kFloat32) continue;  // same
      // The executor's call (Gemm) but for the shape: N, N, fp32 compute, default algorithm.
      CUBLAS_RETURN_IF_ERROR(
          *blas.api, blas.api->gemm_ex(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, d, d, d, &alpha, a,
                                       CudaType(type), d, b, CudaType(type), d, &beta, c, out_type,
                                       d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  return absl::OkStatus();
}

absl::Status PreloadFusedMatmulKernels() {
  static absl::Mutex mu(absl::kConstInit);
  static auto* done = new std::map<int, cudaError_t>();
  int device = -1;  // a test's replaced runtime has no device
  if (g_runtime == &kRealRuntime) {
    if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
      return absl::InternalError(absl::StrCat(
          "cudaGetDevice before preloading the fused matmul kernels: ", cudaGetErrorName(err)));
    }
  }
  absl::MutexLock lock(&mu);
  auto [it, inserted] = done->try_emplace(device, cudaSuccess);
  if (inserted) it->second = g_runtime->preload();
  if (it->second != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("loading the fused matmul kernels: ", cudaGetErrorName(it->second), ": ",
                     cudaGetErrorString(it->second)));
  }
  return absl::OkStatus();
}

namespace cuda_internal {

void SetFusedKernelRuntimeForTesting(const FusedKernelRuntime* runtime) {
  g_runtime = runtime == nullptr ? &kRealRuntime : runtime;
}

}  // namespace cuda_internal
}  // namespace commd::kernels
