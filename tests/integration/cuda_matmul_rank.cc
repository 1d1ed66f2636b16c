// A rank of a fused-matmul job on tests/fixtures/fake_libcuda that runs the SDK's CUDA path of
// Group::AllGatherMatmul and Group::MatmulReduceScatter with only the hardware replaced at its
// boundaries: the kernel launches (kernels::cuda_internal::SetKernelRuntimeForTesting and
// SetFusedKernelRuntimeForTesting) and the cuBLAS table (SetCublasForTesting). Everything
// else is the real SDK (checks, group state, scratch, recorder, events, plan, executor).
//
// The fake's device memory is host memory, mapped into every rank, so the replaced launches
// do on the host what each kernel does on the GPU, in the order the SDK enqueues them: the
// arrival, the waits and the barrier use the real signal pads (release stores, acquire
// spins), and the fake cublasGemmEx is a column-major
// GEMM with cuBLAS's argument conventions. Every call is logged, and this rank checks:
//   1. without cuBLAS (COMMD_CUBLAS_LIBRARY names a missing file) a fused matmul fails with
//      FAILED_PRECONDITION naming the library, before anything is launched; with cuBLAS, the
//      group's first fused matmul warms it (issue #36 fix 4): one GEMM of each operand type and
//      result type the fused calls use, before the call's first step;
//   2. all-gather + matmul (fp32, two Bs, row and column scales, the gathered A; then bf16
//      with row scales, through the fp32 scratch): the arrival first, its own shard's GEMMs
//      before any wait, then for each peer in ring order its wait before its GEMMs, each
//      GEMM reading the peer's buffer where it lies (B first: C^T = B^T A^T) and writing its
//      rows of the output (or the scratch), the closing barrier last; the results against a
//      float64 reference;
//   3. matmul + reduce-scatter (fp16, avg, row and column scales): destinations in ring order
//      with its own last and no wait for itself, each partial product written into slot
//      `rank` of the destination's workspace, one barrier, then the reduction and nothing
//      after it; the result against a float64 reference;
//   4. a NaN in one rank's shard, checked, reaches that rank's control-block counters;
//   5. a GEMM failing once the call's first steps are enqueued fails the group for good,
//      saying how many of its steps were enqueued; later calls launch nothing;
//   6. (across 2 and 3) every GEMM of a call ran with a cuBLAS workspace of its stream's own,
//      set after the stream (cublasSetStream resets it), streams 0x1000 and 0x2000 apart
//      (issue #36 fix 5).
// Prints "OK" and exits 0, or "ERROR <what>" and exits 1.
//
//   cuda_matmul_rank GROUP RANK WORLD
#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "common/control_block.h"
#include "common/status_macros.h"
#include "kernels/cuda/collectives.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/fused_matmul.h"
#include "kernels/float16.h"
#include "kernels/signal_layout.h"

namespace {

namespace k = commd::kernels;
using k::FusedStepKind;
using k::cuda_internal::FusedLaunchArgs;
using k::cuda_internal::LaunchArgs;

// One logged call: "arrive", "wait", "gemm", "scale", "gather", "barrier", "reduce".
struct Call {
  std::string what;
  int peer = -1;
  const void* first = nullptr;   // gemm: cuBLAS's first operand (B)
  const void* second = nullptr;  // gemm: its second (the A rows)
  void* out = nullptr;           // gemm: C; scale, gather, reduce: dst
  int m = 0, n = 0, kk = 0, lda = 0, ldb = 0, ldc = 0;
  cudaDataType c_type = CUDA_R_32F;
  cudaDataType a_type = CUDA_R_32F;  // gemm: the operands'
};
std::vector<Call> calls;
// cuBLAS's handle state as the fake keeps it: the stream, and the workspace set since (null:
// cuBLAS's pool, which cublasSetStream goes back to). Each GEMM's is recorded.
struct GemmPlace {
  uintptr_t stream;
  const void* workspace;
  size_t workspace_bytes;
};
uintptr_t blas_stream = 0;
GemmPlace blas_workspace{};
std::vector<GemmPlace> gemm_places;
int fail_gemm = -1;  // the GEMM (counted from 0 from when this is set) that fails; -1: none

// --- the device, emulated on the host ------------------------------------------------------

uint32_t Load(const uint32_t* p) {
  return std::atomic_ref(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
}
void Store(uint32_t* p, uint32_t v) { std::atomic_ref(*p).store(v, std::memory_order_release); }

// Arrival on `channel`: this rank's count there grows by one and reaches every peer's slot.
void Arrive(const k::CudaCommView& v, int channel) {
  uint32_t* own = v.pads[v.rank] + k::PadSlot(channel, v.rank, v.world_size);
  const uint32_t seq = *own + 1;
  *own = seq;
  for (int p = 0; p < v.world_size; ++p) {
    if (p != v.rank) Store(v.pads[p] + k::PadSlot(channel, v.rank, v.world_size), seq);
  }
}

// Until `peer` has made this rank's latest arrival on `channel` (30 s at most).
bool Wait(const k::CudaCommView& v, int channel, int peer) {
  const uint32_t seq = *(v.pads[v.rank] + k::PadSlot(channel, v.rank, v.world_size));
  const uint32_t* slot = v.pads[v.rank] + k::PadSlot(channel, peer, v.world_size);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (static_cast<int32_t>(Load(slot) - seq) < 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(50));
  }
  return true;
}

float Read(const void* p, size_t i, cudaDataType t) {
  if (t == CUDA_R_16F) return k::HalfToFloat(static_cast<const k::Half*>(p)[i]);
  if (t == CUDA_R_16BF) return k::BFloat16ToFloat(static_cast<const k::BFloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
void Write(void* p, size_t i, cudaDataType t, float x) {
  if (t == CUDA_R_16F) {
    static_cast<k::Half*>(p)[i] = k::FloatToHalf(x);
  } else if (t == CUDA_R_16BF) {
    static_cast<k::BFloat16*>(p)[i] = k::FloatToBFloat16(x);
  } else {
    static_cast<float*>(p)[i] = x;
  }
}
cudaDataType TypeOf(::commd::DataType t) {
  return t == ::commd::DataType::kFloat16    ? CUDA_R_16F
         : t == ::commd::DataType::kBFloat16 ? CUDA_R_16BF
                                             : CUDA_R_32F;
}

// The collectives' kernels: none may run in a fused matmul (logged, and failing).
cudaError_t FakeCollective(const k::CudaCommView&, const LaunchArgs&, cudaStream_t) {
  calls.push_back({"collective-kernel"});
  return cudaErrorNotSupported;
}

cudaError_t FakeFused(const k::CudaCommView& v, const FusedLaunchArgs& a, cudaStream_t) {
  Call c{k::FusedStepName(a.kind), a.peer};
  c.out = a.dst;
  calls.push_back(c);
  const cudaDataType t = TypeOf(a.dtype);
  switch (a.kind) {
    case FusedStepKind::kArrive:
      Arrive(v, k::kFusedSignalChannel);
      return cudaSuccess;
    case FusedStepKind::kWait:
      return Wait(v, k::kFusedSignalChannel, a.peer) ? cudaSuccess : cudaErrorLaunchTimeout;
    case FusedStepKind::kBarrier:  // FencedBarrierKernel: arrive, then wait for every peer
      Arrive(v, k::kFusedSignalChannel);
      for (int p = 0; p < v.world_size; ++p) {
        if (p != v.rank && !Wait(v, k::kFusedSignalChannel, p)) return cudaErrorLaunchTimeout;
      }
      return cudaSuccess;
    case FusedStepKind::kPrepare: {
      unsigned long long bad = 0;
      for (size_t i = 0; i < a.count; ++i) bad += std::isfinite(Read(a.src, i, t)) ? 0 : 1;
      if (bad != 0 && v.nonfinite_count != nullptr) {
        std::atomic_ref(*v.nonfinite_count).fetch_add(bad, std::memory_order_release);
      }
      for (size_t i = 0; i < a.scale_rows; ++i) a.staged_scale[i] = a.row_scale[i];
      return cudaSuccess;
    }
    case FusedStepKind::kScale:
      for (size_t i = 0; i < a.count; ++i) {
        const float rs = a.row_scale != nullptr ? a.row_scale[i / a.cols] : 1.0f;
        const float f = a.col_scale != nullptr ? rs * a.col_scale[i % a.cols] : rs;
        Write(a.dst, i, t, static_cast<const float*>(a.src)[i] * f);
      }
      return cudaSuccess;
    case FusedStepKind::kGather:
      std::memcpy(a.dst, a.src, a.count);
      return cudaSuccess;
    case FusedStepKind::kReduce:
      for (size_t i = 0; i < a.count; ++i) {
        float acc = 0;
        for (int p = 0; p < v.world_size; ++p)
          acc += static_cast<const float*>(a.src)[p * a.count + i];
        Write(a.dst, i, t, a.op == ::commd::ReduceOp::kAvg ? acc / v.world_size : acc);
      }
      return cudaSuccess;
    default:
      return cudaErrorNotSupported;
  }
}
cudaError_t FakePreload() { return cudaSuccess; }

// cuBLAS, column-major: C(i, j) = sum_l first(i, l) second(l, j).
cublasStatus_t FakeCreate(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(0xb1a5);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t FakeDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t FakeSetStream(cublasHandle_t, cudaStream_t stream) {
  blas_stream = reinterpret_cast<uintptr_t>(stream);
  blas_workspace = {};  // as cuBLAS: back to its pool
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t FakeSetWorkspace(cublasHandle_t, void* workspace, size_t bytes) {
  blas_workspace = {blas_stream, workspace, bytes};
  return CUBLAS_STATUS_SUCCESS;
}
const char* FakeStatus(cublasStatus_t) { return "FAKE"; }
cublasStatus_t FakeGemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                        int kk, const void* alpha, const void* x, cudaDataType xt, int lda,
                        const void* y, cudaDataType yt, int ldb, const void* beta, void* c,
                        cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (ta != CUBLAS_OP_N || tb != CUBLAS_OP_N || compute != CUBLAS_COMPUTE_32F ||
      *static_cast<const float*>(alpha) != 1.0f || *static_cast<const float*>(beta) != 0.0f) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (fail_gemm >= 0 && fail_gemm-- == 0) return CUBLAS_STATUS_EXECUTION_FAILED;
  calls.push_back({"gemm", -1, x, y, c, m, n, kk, lda, ldb, ldc, ct, xt});
  gemm_places.push_back({blas_stream, blas_workspace.workspace, blas_workspace.workspace_bytes});
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc = 0;
      for (int l = 0; l < kk; ++l) {
        acc += Read(x, i + static_cast<size_t>(l) * lda, xt) *
               Read(y, l + static_cast<size_t>(j) * ldb, yt);
      }
      Write(c, i + static_cast<size_t>(j) * ldc, ct, acc);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

const k::cuda_internal::KernelRuntime kCollectives{&FakeCollective, &FakePreload};
const k::cuda_internal::FusedKernelRuntime kFused{&FakeFused, &FakePreload};
k::CublasApi FakeCublas() {
  k::CublasApi api;
  api.create = &FakeCreate;
  api.destroy = &FakeDestroy;
  api.set_stream = &FakeSetStream;
  api.set_workspace = &FakeSetWorkspace;
  api.get_status_name = &FakeStatus;
  api.get_status_string = &FakeStatus;
  api.gemm_ex = &FakeGemm;
  api.library = "fake";
  return api;
}

// --- the checks ----------------------------------------------------------------------------

struct Region {
  std::string name;
  const void* begin;
  size_t bytes;
};
std::vector<Region> regions;  // what a logged pointer may point into

std::string Where(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  for (const Region& r : regions) {
    const auto b = reinterpret_cast<uintptr_t>(r.begin);
    if (x >= b && x < b + r.bytes) return x == b ? r.name : absl::StrCat(r.name, "+", x - b);
  }
  return "elsewhere";
}

std::string Describe(const Call& c) {
  if (c.what == "gemm") {
    return absl::StrCat("gemm(", Where(c.first), " x ", Where(c.second), " -> ", Where(c.out),
                        c.c_type == CUDA_R_32F ? " f32" : "", " m", c.m, " n", c.n, " k", c.kk,
                        " ld", c.lda, "/", c.ldb, "/", c.ldc, ")");
  }
  if (c.what == "wait") return absl::StrCat("wait(", c.peer, ")");
  if (c.out != nullptr) return absl::StrCat(c.what, "(", Where(c.out), ")");
  return c.what;
}

std::string Log() {
  std::vector<std::string> out;
  for (const Call& c : calls) out.push_back(Describe(c));
  calls.clear();
  return absl::StrJoin(out, " ");
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// Values exact in every type (small multiples of 1/4).
float AValue(int rank, size_t i, size_t l) {
  return static_cast<float>((rank * 7 + static_cast<int>(i * 3 + l)) % 11 - 5) * 0.25f;
}
float BValue(int which, size_t l, size_t j) {
  return static_cast<float>(static_cast<int>(l * 5 + j * (which + 1)) % 7 - 3) * 0.5f;
}
float RowScale(int rank, size_t i) { return 1.0f + 0.5f * rank + 0.25f * static_cast<float>(i); }
float ColScale(size_t j) { return 1.0f + 0.125f * static_cast<float>(j); }

template <typename T>
std::vector<T> Matrix(size_t rows, size_t cols, const std::function<float(size_t, size_t)>& f,
                      T (*convert)(float)) {
  std::vector<T> m(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) m[i * cols + j] = convert(f(i, j));
  }
  return m;
}
float Same(float x) { return x; }

absl::Status Near(const std::string& what, double got, double want, double tol) {
  return Expect(std::fabs(got - want) <= tol * (1 + std::fabs(want)),
                absl::StrCat(what, ": got ", got, ", want ", want));
}

constexpr size_t kRows = 3, kK = 5;

absl::Status NoCublas(commd::Group& g, commd::SymmetricBuffer& buf) {
  std::vector<float> b(kK * 4), out(g.world_size() * kRows * 4);
  const absl::Status s =
      g.AllGatherMatmul(buf, kRows, kK, commd::DataType::kFloat32, {{b.data(), 4, out.data()}});
  RETURN_IF_ERROR(Expect(absl::IsFailedPrecondition(s) &&
                             absl::StrContains(s.message(), "cuBLAS") &&
                             absl::StrContains(s.message(), "/nonexistent/libcublas.so.13"),
                         absl::StrCat("without cuBLAS: ", s.ToString())));
  return Expect(calls.empty(), absl::StrCat("launched without cuBLAS: ", Log()));
}

std::string TypeName(cudaDataType t) {
  return t == CUDA_R_32F ? "f32" : t == CUDA_R_16F ? "f16" : t == CUDA_R_16BF ? "bf16" : "?";
}

// The group's first fused matmul (on stream 0x1000) warmed cuBLAS before its first step: one
// 64-cubed GEMM per operand and result type the fused calls use, on cuBLAS's own pool. They
// are taken off the log.
absl::Status WarmedFirst() {
  const std::vector<std::string> want = {"f32->f32", "f16->f16", "f16->f32", "bf16->bf16",
                                         "bf16->f32"};
  std::vector<std::string> got;
  for (size_t i = 0; i < calls.size() && i < want.size(); ++i) {
    const Call& c = calls[i];
    if (c.what != "gemm" || c.m != 64 || c.n != 64 || c.kk != 64) break;
    got.push_back(TypeName(c.a_type) + "->" + TypeName(c.c_type));
  }
  if (got != want) {  // Log() empties the log: only for the message
    return absl::InternalError(absl::StrCat("cuBLAS warmed with ", absl::StrJoin(got, " "),
                                            "; want ", absl::StrJoin(want, " "),
                                            " before the call: ", Log()));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    RETURN_IF_ERROR(Expect(gemm_places[i].stream == 0x1000 && gemm_places[i].workspace == nullptr,
                           "a warming GEMM not on the call's stream and cuBLAS's pool"));
  }
  calls.erase(calls.begin(), calls.begin() + static_cast<long>(want.size()));
  gemm_places.erase(gemm_places.begin(), gemm_places.begin() + static_cast<long>(want.size()));
  return absl::OkStatus();
}

// Every GEMM since the warming ran on a workspace of its stream's own (set after the stream),
// and the workspaces of streams 0x1000 and 0x2000 do not overlap.
absl::Status WorkspacePerStream() {
  std::vector<GemmPlace> by_stream;  // one per stream
  for (const GemmPlace& g : gemm_places) {
    RETURN_IF_ERROR(Expect(g.workspace != nullptr && g.workspace_bytes >= (size_t{4} << 20),
                           absl::StrCat("a GEMM on stream 0x", absl::Hex(g.stream),
                                        " ran on cuBLAS's shared pool, or a small workspace (",
                                        g.workspace_bytes, " bytes)")));
    bool seen = false;
    for (const GemmPlace& s : by_stream) {
      if (s.stream != g.stream) continue;
      seen = true;
      RETURN_IF_ERROR(Expect(s.workspace == g.workspace, "one stream, two workspaces"));
    }
    if (!seen) by_stream.push_back(g);
  }
  RETURN_IF_ERROR(Expect(by_stream.size() == 2, absl::StrCat(by_stream.size(), " streams")));
  const auto a = reinterpret_cast<uintptr_t>(by_stream[0].workspace);
  const auto b = reinterpret_cast<uintptr_t>(by_stream[1].workspace);
  return Expect(a + by_stream[0].workspace_bytes <= b || b + by_stream[1].workspace_bytes <= a,
                "streams 0x1000 and 0x2000 share a cuBLAS workspace");
}

// The ring: own first, then rank + 1, rank + 2, ...
std::vector<int> Ring(int rank, int world) {
  std::vector<int> order;
  for (int i = 0; i < world; ++i) order.push_back((rank + i) % world);
  return order;
}

absl::Status AllGatherMatmulFp32(commd::Group& g, commd::SymmetricBuffer& buf) {
  const int r = g.rank(), w = g.world_size();
  const size_t n0 = 4, n1 = 3;
  auto shard = Matrix<float>(
      kRows, kK, [&](size_t i, size_t l) { return AValue(r, i, l); }, Same);
  std::memcpy(buf.data(), shard.data(), shard.size() * sizeof(float));
  std::vector<float> rs(kRows), cs(n0);
  for (size_t i = 0; i < kRows; ++i) rs[i] = RowScale(r, i);
  for (size_t j = 0; j < n0; ++j) cs[j] = ColScale(j);
  auto b0 = Matrix<float>(
      kK, n0, [](size_t l, size_t j) { return BValue(0, l, j); }, Same);
  auto b1 = Matrix<float>(
      kK, n1, [](size_t l, size_t j) { return BValue(1, l, j); }, Same);
  std::vector<float> out0(w * kRows * n0), out1(w * kRows * n1), gathered(w * kRows * kK);
  regions = {{"B0", b0.data(), b0.size() * 4},
             {"B1", b1.data(), b1.size() * 4},
             {"out0", out0.data(), out0.size() * 4},
             {"out1", out1.data(), out1.size() * 4},
             {"gathered", gathered.data(), gathered.size() * 4}};
  for (int p = 0; p < w; ++p) regions.push_back({absl::StrCat("rank", p), buf.peer(p), buf.size()});
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  o.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  RETURN_IF_ERROR(g.AllGatherMatmul(
      buf, kRows, kK, commd::DataType::kFloat32,
      {{b0.data(), n0, out0.data(), cs.data()}, {b1.data(), n1, out1.data(), nullptr}}, rs.data(),
      gathered.data(), o));
  RETURN_IF_ERROR(WarmedFirst());
  // The protocol, spelled out: B is cuBLAS's first operand (C^T = B^T A^T), the A rows are
  // the owner's buffer itself, and each shard's rows go to p * rows of each output.
  std::vector<std::string> want = {"prepare", "arrive"};
  for (int p : Ring(r, w)) {
    if (p != r) want.push_back(absl::StrCat("wait(", p, ")"));
    const std::string o0 = p == 0 ? "out0" : absl::StrCat("out0+", p * kRows * n0 * 4);
    const std::string o1 = p == 0 ? "out1" : absl::StrCat("out1+", p * kRows * n1 * 4);
    const std::string gp = p == 0 ? "gathered" : absl::StrCat("gathered+", p * kRows * kK * 4);
    want.push_back(absl::StrCat("gemm(B0 x rank", p, " -> ", o0, " f32 m4 n3 k5 ld4/5/4)"));
    want.push_back(absl::StrCat("scale(", o0, ")"));
    want.push_back(absl::StrCat("gemm(B1 x rank", p, " -> ", o1, " f32 m3 n3 k5 ld3/5/3)"));
    want.push_back(absl::StrCat("scale(", o1, ")"));
    want.push_back(absl::StrCat("gather(", gp, ")"));
  }
  want.push_back("barrier");
  const std::string log = Log();
  RETURN_IF_ERROR(Expect(log == absl::StrJoin(want, " "),
                         absl::StrCat("all-gather + matmul fp32 log:\n  got  ", log, "\n  want ",
                                      absl::StrJoin(want, " "))));
  for (int p = 0; p < w; ++p) {
    for (size_t i = 0; i < kRows; ++i) {
      for (size_t l = 0; l < kK; ++l) {
        RETURN_IF_ERROR(Near(absl::StrCat("gathered[", p, "][", i, "][", l, "]"),
                             gathered[(p * kRows + i) * kK + l], AValue(p, i, l), 0));
      }
      for (size_t j = 0; j < n0 + n1; ++j) {
        const bool first = j < n0;
        const size_t jj = first ? j : j - n0, n = first ? n0 : n1;
        double want_v = 0;
        for (size_t l = 0; l < kK; ++l)
          want_v += double{AValue(p, i, l)} * BValue(first ? 0 : 1, l, jj);
        want_v *= RowScale(p, i) * (first ? ColScale(jj) : 1.0);
        const float got = (first ? out0 : out1)[(p * kRows + i) * n + jj];
        RETURN_IF_ERROR(Near(absl::StrCat("out", first ? 0 : 1, "[", p * kRows + i, "][", jj, "]"),
                             got, want_v, 1e-5));
      }
    }
  }
  return absl::OkStatus();
}

// bf16 with row scales: each GEMM writes fp32 into the stream's scratch (no known buffer),
// and the scale kernel rounds into the output once, after scaling.
absl::Status AllGatherMatmulBf16(commd::Group& g, commd::SymmetricBuffer& buf) {
  const int r = g.rank(), w = g.world_size();
  const size_t n = 2;
  auto shard = Matrix<k::BFloat16>(
      kRows, kK, [&](size_t i, size_t l) { return AValue(r, i, l); }, &k::FloatToBFloat16);
  std::memcpy(buf.data(), shard.data(), shard.size() * 2);
  std::vector<float> rs(kRows);
  for (size_t i = 0; i < kRows; ++i) rs[i] = RowScale(r, i);
  auto b = Matrix<k::BFloat16>(
      kK, n, [](size_t l, size_t j) { return BValue(0, l, j); }, &k::FloatToBFloat16);
  std::vector<k::BFloat16> out(w * kRows * n);
  regions = {{"B", b.data(), b.size() * 2}, {"out", out.data(), out.size() * 2}};
  for (int p = 0; p < w; ++p) regions.push_back({absl::StrCat("rank", p), buf.peer(p), buf.size()});
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x2000);
  o.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  RETURN_IF_ERROR(g.AllGatherMatmul(buf, kRows, kK, commd::DataType::kBFloat16,
                                    {{b.data(), n, out.data()}}, rs.data(), nullptr, o));
  std::vector<std::string> want = {"prepare", "arrive"};
  for (int p : Ring(r, w)) {
    if (p != r) want.push_back(absl::StrCat("wait(", p, ")"));
    want.push_back(absl::StrCat("gemm(B x rank", p, " -> elsewhere f32 m2 n3 k5 ld2/5/2)"));
    want.push_back(
        absl::StrCat("scale(", p == 0 ? "out" : absl::StrCat("out+", p * kRows * n * 2), ")"));
  }
  want.push_back("barrier");
  const std::string log = Log();
  RETURN_IF_ERROR(Expect(log == absl::StrJoin(want, " "),
                         absl::StrCat("all-gather + matmul bf16 log:\n  got  ", log, "\n  want ",
                                      absl::StrJoin(want, " "))));
  for (int p = 0; p < w; ++p) {
    for (size_t i = 0; i < kRows; ++i) {
      for (size_t j = 0; j < n; ++j) {
        double want_v = 0;
        for (size_t l = 0; l < kK; ++l) want_v += double{AValue(p, i, l)} * BValue(0, l, j);
        want_v *= RowScale(p, i);
        RETURN_IF_ERROR(Near(absl::StrCat("bf16 out[", p * kRows + i, "][", j, "]"),
                             k::BFloat16ToFloat(out[(p * kRows + i) * n + j]), want_v, 1e-2));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MatmulReduceScatterFp16(commd::Group& g, commd::SymmetricBuffer& workspace) {
  const int r = g.rank(), w = g.world_size();
  const size_t rows = 2 * static_cast<size_t>(w), chunk = 2, n = 3;
  auto a = Matrix<k::Half>(
      rows, kK, [&](size_t i, size_t l) { return AValue(r, i, l); }, &k::FloatToHalf);
  std::vector<float> rs(rows), cs(n);
  for (size_t i = 0; i < rows; ++i) rs[i] = RowScale(r, i);
  for (size_t j = 0; j < n; ++j) cs[j] = ColScale(j);
  auto b = Matrix<k::Half>(
      kK, n, [](size_t l, size_t j) { return BValue(1, l, j); }, &k::FloatToHalf);
  std::vector<k::Half> out(chunk * n);
  regions = {{"A", a.data(), a.size() * 2},
             {"B", b.data(), b.size() * 2},
             {"out", out.data(), out.size() * 2}};
  for (int p = 0; p < w; ++p) {
    regions.push_back({absl::StrCat("ws", p), workspace.peer(p), workspace.size()});
  }
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  o.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  RETURN_IF_ERROR(g.MatmulReduceScatter(a.data(), rows, kK, commd::DataType::kFloat16,
                                        {b.data(), n, out.data(), cs.data()}, commd::ReduceOp::kAvg,
                                        workspace, rs.data(), o));
  std::vector<std::string> want = {"arrive"};
  for (int i = 1; i <= w; ++i) {
    const int d = (r + i) % w;  // own rows last, no wait for itself
    if (d != r) want.push_back(absl::StrCat("wait(", d, ")"));
    const std::string slot =
        r == 0 ? absl::StrCat("ws", d) : absl::StrCat("ws", d, "+", r * chunk * n * 4);
    const std::string rows_of = d == 0 ? "A" : absl::StrCat("A+", d * chunk * kK * 2);
    want.push_back(absl::StrCat("gemm(B x ", rows_of, " -> ", slot, " f32 m3 n2 k5 ld3/5/3)"));
    want.push_back(absl::StrCat("scale(", slot, ")"));
  }
  want.push_back("barrier");
  want.push_back("reduce(out)");
  const std::string log = Log();
  RETURN_IF_ERROR(Expect(log == absl::StrJoin(want, " "),
                         absl::StrCat("matmul + reduce-scatter log:\n  got  ", log, "\n  want ",
                                      absl::StrJoin(want, " "))));
  for (size_t i = 0; i < chunk; ++i) {
    const size_t row = static_cast<size_t>(r) * chunk + i;
    for (size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < w; ++p) {
        double dot = 0;
        for (size_t l = 0; l < kK; ++l) dot += double{AValue(p, row, l)} * BValue(1, l, j);
        sum += dot * RowScale(p, row) * ColScale(j);
      }
      RETURN_IF_ERROR(Near(absl::StrCat("reduce-scatter out[", i, "][", j, "]"),
                           k::HalfToFloat(out[i * n + j]), sum / w, 2e-3));
    }
  }
  return absl::OkStatus();
}

// NaN/Inf counted on the device (the prepare kernel, into the call's counter): rank 1's shard
// has one NaN; the next call retires the checked call into the control block's counters.
absl::Status NanCountedOnTheDevice(commd::Group& g, commd::SymmetricBuffer& buf) {
  const int w = g.world_size();
  std::vector<float> shard(kRows * kK, 1.0f), b(kK * 2, 1.0f), out(w * kRows * 2);
  if (g.rank() == 1) shard[4] = NAN;
  std::memcpy(buf.data(), shard.data(), shard.size() * sizeof(float));
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  o.nan_check = commd::CollectiveOptions::NanCheck::kOn;
  RETURN_IF_ERROR(g.AllGatherMatmul(buf, kRows, kK, commd::DataType::kFloat32,
                                    {{b.data(), 2, out.data()}}, nullptr, nullptr, o));
  const std::string log = Log();
  RETURN_IF_ERROR(Expect(log.rfind("prepare arrive ", 0) == 0,
                         "a checked call does not start with the NaN/Inf scan: " + log));
  o.nan_check = commd::CollectiveOptions::NanCheck::kOff;  // retires the checked call
  RETURN_IF_ERROR(g.AllGatherMatmul(buf, kRows, kK, commd::DataType::kFloat32,
                                    {{b.data(), 2, out.data()}}, nullptr, nullptr, o));
  calls.clear();
  const auto* counters = reinterpret_cast<const commd::ControlBlockCounters*>(
      static_cast<const char*>(g.control_block()) + commd::kCountersOffset);
  return Expect(
      counters->nan_checks == 1 && counters->nans_found == (g.rank() == 1 ? 1u : 0u),
      absl::StrCat("nan counters: checks ", counters->nan_checks, " found ", counters->nans_found));
}

// A GEMM failing after the call's first steps were enqueued (every rank's first peer GEMM, so
// every rank fails alike) fails the group for good: FAILED_PRECONDITION saying how many of the
// plan's steps were enqueued (arrive, own GEMM, wait: 3 of 7 for one unscaled B on 3 ranks),
// and every later call fails the same way without launching anything.
absl::Status FailedGemmFailsTheGroup(commd::Group& g, commd::SymmetricBuffer& buf) {
  const int w = g.world_size();
  std::vector<float> b(kK * 2), out(w * kRows * 2);
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  o.nan_check = commd::CollectiveOptions::NanCheck::kOff;
  fail_gemm = 1;
  const absl::Status s = g.AllGatherMatmul(buf, kRows, kK, commd::DataType::kFloat32,
                                           {{b.data(), 2, out.data()}}, nullptr, nullptr, o);
  const std::string want = absl::StrCat("enqueued 3 of its ", 2 * w + 1, " kernels");
  RETURN_IF_ERROR(Expect(absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), want) &&
                             absl::StrContains(s.message(), "(cublasStatus_t 13)"),
                         absl::StrCat("a failing GEMM: want \"", want, "\", got ", s.ToString())));
  calls.clear();
  const absl::Status later = g.AllGatherMatmul(buf, kRows, kK, commd::DataType::kFloat32,
                                               {{b.data(), 2, out.data()}}, nullptr, nullptr, o);
  RETURN_IF_ERROR(Expect(absl::IsFailedPrecondition(later) &&
                             absl::StrContains(later.message(), "barrier counts now differ"),
                         absl::StrCat("the call after a failed GEMM: ", later.ToString())));
  return Expect(calls.empty(), absl::StrCat("launched after the group failed: ", Log()));
}

int Fail(const absl::Status& status) {
  std::printf("ERROR %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

absl::Status Run(int rank, int world, const char* name) {
  k::cuda_internal::SetKernelRuntimeForTesting(&kCollectives);
  k::cuda_internal::SetFusedKernelRuntimeForTesting(&kFused);
  commd::GroupOptions options;
  options.name = name;
  options.rank = rank;
  options.world_size = world;
  options.device = commd::Device::Cuda(0);
  options.timeout = absl::Seconds(60);
  ASSIGN_OR_RETURN(auto client, commd::Client::Connect({}));
  ASSIGN_OR_RETURN(auto group, client->JoinGroup(options));
  ASSIGN_OR_RETURN(auto buf, group->AllocateSymmetric(1 << 16));
  ASSIGN_OR_RETURN(auto workspace, group->AllocateSymmetric(1 << 16));
  RETURN_IF_ERROR(NoCublas(*group, *buf));
  static const k::CublasApi fake = FakeCublas();
  k::cuda_internal::SetCublasForTesting(&fake);
  RETURN_IF_ERROR(AllGatherMatmulFp32(*group, *buf));
  RETURN_IF_ERROR(AllGatherMatmulBf16(*group, *buf));
  RETURN_IF_ERROR(MatmulReduceScatterFp16(*group, *workspace));
  RETURN_IF_ERROR(WorkspacePerStream());
  RETURN_IF_ERROR(NanCountedOnTheDevice(*group, *buf));
  RETURN_IF_ERROR(FailedGemmFailsTheGroup(*group, *buf));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, world = 0;
  if (argc != 4 || !absl::SimpleAtoi(argv[2], &rank) || !absl::SimpleAtoi(argv[3], &world)) {
    std::fprintf(stderr, "usage: cuda_matmul_rank GROUP RANK WORLD\n");
    return 2;
  }
  if (absl::Status s = Run(rank, world, argv[1]); !s.ok()) return Fail(s);
  std::printf("OK\n");
  std::fflush(stdout);
  return 0;
}
