// Argument checks and launch of the CUDA collectives (host code; kernels in collectives.cu).
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/comm_view_check.h"
#include "kernels/cuda/collectives.h"
#include "kernels/host/plan.h"
#include "kernels/signal_layout.h"

namespace commd::kernels {
namespace {

using cuda_internal::KernelRuntime;
using cuda_internal::LaunchArgs;

constexpr KernelRuntime kRealRuntime{&cuda_internal::LaunchKernel, &cuda_internal::PreloadKernels};
const KernelRuntime* g_runtime = &kRealRuntime;

// "barrier", "one_shot all_reduce", "all_gather", ... (the vocabulary's names).
std::string LaunchName(const LaunchArgs& a) {
  if (a.count_only) return "NaN/Inf count";
  if (a.collective == CollectiveOp::kAllReduce) {
    return absl::StrCat(AlgorithmName(a.algorithm), " ", CollectiveName(a.collective));
  }
  return std::string(CollectiveName(a.collective));
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Fills offset/in_place/output_is_input and checks sizes and placement (rules of
// host/collectives.h).
absl::Status Place(const CudaCommView& v, const char* name, size_t in_bytes, size_t out_bytes,
                   bool output_may_be_input, LaunchArgs* a) {
  for (absl::Status s : {CheckCollectiveType(a->dtype), CheckReduceOp(a->op, a->dtype)}) {
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
  }
  if (in_bytes > v.data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": input of ", in_bytes,
                                                   " bytes exceeds the data region of ",
                                                   v.data_bytes, " bytes per rank"));
  }
  if (a->input == nullptr || a->output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": null input or output"));
  }
  const auto own = reinterpret_cast<uintptr_t>(v.data[v.rank]);
  const auto in = reinterpret_cast<uintptr_t>(a->input);
  a->in_place = in >= own && in + in_bytes <= own + v.data_bytes;
  a->offset = a->in_place ? in - own : 0;
  a->output_is_input = output_may_be_input && a->in_place && a->output == a->input;
  for (int p = 0; p < v.world_size; ++p) {
    if (!a->in_place && Overlaps(a->input, in_bytes, v.data[p], v.data_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": input overlaps rank ", p, "'s data region but is not in place"));
    }
    if (!a->output_is_input && Overlaps(a->output, out_bytes, v.data[p], v.data_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": output overlaps rank ", p, "'s data region"));
    }
  }
  return absl::OkStatus();
}

absl::Status Launch(const CudaCommView& v, const LaunchArgs& a, cudaStream_t stream) {
  const cudaError_t err = g_runtime->launch(v, a, stream);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("launch of the ", LaunchName(a), " kernel: ",
                                            cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

LaunchArgs Args(CollectiveOp c, const void* input, void* output, size_t count, DataType dtype,
                ReduceOp op, NanCheck nan_check, int root = 0) {
  return LaunchArgs{.collective = c,
                    .algorithm = Algorithm::kTwoShot,
                    .input = input,
                    .output = output,
                    .scratch = nullptr,
                    .count = count,
                    .offset = 0,
                    .in_place = false,
                    .output_is_input = false,
                    .dtype = dtype,
                    .op = op,
                    .nan_check = nan_check,
                    .root = root};
}

// Byte sizes (INVALID_ARGUMENT on overflow; the vocabulary's row says which of input and
// output hold world_size x count elements), placement, launch. The output may be the input
// itself (in place) only for broadcast, as on the CPU path.
absl::Status PlaceAndLaunch(const CudaCommView& v, LaunchArgs a, cudaStream_t stream) {
  const vocabulary::CollectiveRow& row = CollectiveInfo(a.collective);
  size_t bytes = 0, all = 0;
  if (__builtin_mul_overflow(a.count, DataTypeSize(a.dtype), &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<size_t>(v.world_size), &all)) {
    return absl::InvalidArgumentError(absl::StrCat(row.torch, ": count ", a.count, " overflows"));
  }
  RETURN_IF_ERROR(Place(v, row.torch, row.wide_in() ? all : bytes, row.wide_out() ? all : bytes,
                        a.collective == CollectiveOp::kBroadcast, &a));
  return Launch(v, a, stream);
}

// Each thread block synchronises on its own channel.
constexpr CommViewRules kCudaRules{
    .max_world_size = kCudaMaxWorldSize,
    .needed_pad_slots = [](int world_size) { return PadSlot(kCudaBlocks, 0, world_size); },
    .pad_layout = [](int) { return absl::StrCat(kCudaBlocks, " blocks x world size"); }};

}  // namespace

absl::Status ValidateCudaCommView(const CudaCommView& v) {
  return CheckCommView(ShapeOfView(v), kCudaRules);
}

absl::Status LaunchBarrier(const CudaCommView& view, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  return Launch(view,
                Args(CollectiveOp::kBarrier, nullptr, nullptr, 0, DataType::kFloat32,
                     ReduceOp::kSum, NanCheck::kOff),
                stream);
}

absl::Status LaunchAllReduce(const CudaCommView& view, const void* input, void* output,
                             size_t count, DataType dtype, ReduceOp op, Algorithm algorithm,
                             NanCheck nan_check, void* scratch, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  if (!IsValid(algorithm)) return absl::InvalidArgumentError("all_reduce: bad algorithm");
  if (count == 0) return absl::OkStatus();
  LaunchArgs a = Args(CollectiveOp::kAllReduce, input, output, count, dtype, op, nan_check);
  a.algorithm = algorithm;
  a.scratch = scratch;
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, DataTypeSize(dtype), &bytes)) bytes = SIZE_MAX;
  RETURN_IF_ERROR(Place(view, CollectiveName(CollectiveOp::kAllReduce), bytes, bytes, true, &a));
  if (algorithm == Algorithm::kOneShot && a.output_is_input && scratch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all_reduce: one-shot with the output being the input in the data region needs scratch "
        "of count (",
        count, ") elements; a separate output needs none"));
  }
  return Launch(view, a, stream);
}

absl::Status LaunchAllGather(const CudaCommView& view, const void* input, void* output,
                             size_t count, DataType dtype, NanCheck nan_check,
                             cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  if (count == 0) return absl::OkStatus();
  return PlaceAndLaunch(
      view, Args(CollectiveOp::kAllGather, input, output, count, dtype, ReduceOp::kSum, nan_check),
      stream);
}

absl::Status LaunchReduceScatter(const CudaCommView& view, const void* input, void* output,
                                 size_t count, DataType dtype, ReduceOp op, NanCheck nan_check,
                                 cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  if (count == 0) return absl::OkStatus();
  return PlaceAndLaunch(
      view, Args(CollectiveOp::kReduceScatter, input, output, count, dtype, op, nan_check), stream);
}

absl::Status LaunchBroadcast(const CudaCommView& view, void* buffer, size_t count, DataType dtype,
                             int root, NanCheck nan_check, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  if (root < 0 || root >= view.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast: root ", root,
                                                   " is out of range [0, ", view.world_size - 1,
                                                   "] (the group's ranks)"));
  }
  if (count == 0) return absl::OkStatus();
  return PlaceAndLaunch(
      view,
      Args(CollectiveOp::kBroadcast, buffer, buffer, count, dtype, ReduceOp::kSum, nan_check, root),
      stream);
}

absl::Status LaunchAllToAll(const CudaCommView& view, const void* input, void* output, size_t count,
                            DataType dtype, NanCheck nan_check, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  if (count == 0) return absl::OkStatus();
  return PlaceAndLaunch(
      view, Args(CollectiveOp::kAllToAll, input, output, count, dtype, ReduceOp::kSum, nan_check),
      stream);
}

absl::Status LaunchCountNonFinite(const CudaCommView& view, const void* input, size_t count,
                                  DataType dtype, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateCudaCommView(view));
  if (absl::Status s = CheckCollectiveType(dtype); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("NaN/Inf count: ", s.message()));
  }
  if (count == 0 || view.nonfinite_count == nullptr) return absl::OkStatus();
  size_t bytes = 0;
  if (input == nullptr || __builtin_mul_overflow(count, DataTypeSize(dtype), &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NaN/Inf count: null input or count ", count, " overflows"));
  }
  LaunchArgs a = Args(CollectiveOp::kAllReduce, input, const_cast<void*>(input), count, dtype,
                      ReduceOp::kSum, NanCheck::kOn);
  a.count_only = true;
  return Launch(view, a, stream);
}

absl::Status PreloadCudaKernels() {
  // Once per device: module loading is per context, and the runtime keeps its reference to
  // the device's primary context (cudaFuncGetAttributes made it) until exit, so the modules
  // stay loaded when a group releases its own. The first answer for a device stands (a
  // failure there means the kernels cannot run on it at all).
  static absl::Mutex mu(absl::kConstInit);
  static auto* done = new std::map<int, cudaError_t>();
  int device = -1;  // a test's replaced runtime has no device
  if (g_runtime == &kRealRuntime) {
    if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaGetDevice before preloading the kernels: ", cudaGetErrorName(err)));
    }
  }
  absl::MutexLock lock(&mu);
  auto [it, inserted] = done->try_emplace(device, cudaSuccess);
  if (inserted) it->second = g_runtime->preload();
  if (it->second != cudaSuccess) {
    return absl::InternalError(absl::StrCat(
        "loading the collective kernels (cudaFuncGetAttributes on each instantiation): ",
        cudaGetErrorName(it->second), ": ", cudaGetErrorString(it->second),
        "; was the SDK built for this GPU's architecture (sm_80, sm_90 and compute_90 PTX)?"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ResidentCollectiveBlocks() {
  int device = -1, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cuda_internal::MinResidentBlocksPerSm(&per_sm);
  if (err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("resident blocks of the collective kernels on device ",
                                            device, ": ", cudaGetErrorName(err), ": ",
                                            cudaGetErrorString(err)));
  }
  return sms * per_sm;
}

namespace cuda_internal {

const KernelRuntime& CurrentKernelRuntime() { return *g_runtime; }

void SetKernelRuntimeForTesting(const KernelRuntime* runtime) {
  g_runtime = runtime == nullptr ? &kRealRuntime : runtime;
}

}  // namespace cuda_internal
}  // namespace commd::kernels
