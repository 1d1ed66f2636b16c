// A rank of one on tests/fixtures/fake_libcuda that runs the SDK's CUDA collectives with the
// kernel launch replaced at the boundary with the CUDA runtime
// (kernels::cuda_internal::SetKernelRuntimeForTesting): everything on the host side is the
// real SDK (the group state, its scratch and NaN/Inf slots, the recorder's stream writes,
// events, capture detection, failure handling), only no kernel runs. Checks, in order:
//   1. one-shot in-place all-reduces on two streams get two scratch buffers that do not
//      overlap; the same stream gets its own back (issue #19 fix 4);
//   2. a stream capturing a CUDA graph is refused with FAILED_PRECONDITION before anything is
//      launched, and the group stays usable;
//   3. a coalesced all-reduce whose second launch fails fails with FAILED_PRECONDITION naming
//      how many kernels were enqueued, and so does every later call (fix 7).
// Prints "OK" and exits 0, or "ERROR <what>" and exits 1.
//
//   cuda_launch_rank GROUP
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "commd/commd.h"
#include "kernels/cuda/collectives.h"

namespace {

using commd::kernels::cuda_internal::KernelRuntime;
using commd::kernels::cuda_internal::LaunchArgs;

struct Launched {
  const void* scratch;
  uintptr_t stream;
  size_t count;
};
std::vector<Launched> launches;
size_t fail_launch = SIZE_MAX;  // index of the launch that fails

cudaError_t FakeLaunch(const commd::kernels::CudaCommView&, const LaunchArgs& a, cudaStream_t s) {
  if (launches.size() == fail_launch) {
    fail_launch = SIZE_MAX;
    return cudaErrorLaunchOutOfResources;
  }
  launches.push_back({a.scratch, reinterpret_cast<uintptr_t>(s), a.count});
  return cudaSuccess;
}
cudaError_t FakePreload() { return cudaSuccess; }
const KernelRuntime kFakeRuntime{&FakeLaunch, &FakePreload};

void* Stream(uintptr_t handle) { return reinterpret_cast<void*>(handle); }

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

absl::Status AllReduceOn(commd::Group& g, commd::SymmetricBuffer& buf, uintptr_t stream,
                         size_t count) {
  commd::CollectiveOptions o;
  o.cuda_stream = Stream(stream);
  return g.AllReduce(buf, count, commd::DataType::kFloat32, commd::ReduceOp::kSum, o);
}

absl::Status ScratchPerStream(commd::Group& g, commd::SymmetricBuffer& buf) {
  for (uintptr_t stream : {0x1000, 0x2000, 0x1000}) {
    if (auto s = AllReduceOn(g, buf, stream, 1024); !s.ok()) return s;
  }
  if (launches.size() != 3) return absl::InternalError(absl::StrCat(launches.size(), " launches"));
  const auto a = reinterpret_cast<uintptr_t>(launches[0].scratch);
  const auto b = reinterpret_cast<uintptr_t>(launches[1].scratch);
  if (auto s = Expect(a != 0 && b != 0, "one-shot in place got no scratch"); !s.ok()) return s;
  if (auto s = Expect(a + 4096 <= b || b + 4096 <= a,
                      absl::StrCat("streams 0x1000 and 0x2000 share scratch (", a, ", ", b, ")"));
      !s.ok()) {
    return s;
  }
  return Expect(launches[2].scratch == launches[0].scratch,
                "stream 0x1000 did not get its own scratch back");
}

absl::Status CaptureRefused(commd::Group& g, commd::SymmetricBuffer& buf) {
  ::setenv("COMMD_FAKE_CUDA_CAPTURING_STREAM", std::to_string(0x3000).c_str(), 1);
  const absl::Status refused = AllReduceOn(g, buf, 0x3000, 16);
  ::unsetenv("COMMD_FAKE_CUDA_CAPTURING_STREAM");
  if (!absl::IsFailedPrecondition(refused) ||
      !absl::StrContains(refused.message(), "capturing a CUDA graph")) {
    return absl::InternalError(absl::StrCat("capture not refused: ", refused.ToString()));
  }
  if (launches.size() != 3) return absl::InternalError("a captured call launched a kernel");
  return AllReduceOn(g, buf, 0x3000, 16);  // not capturing any more: runs
}

absl::Status PartialLaunchFailsTheGroup(commd::Group& g, commd::SymmetricBuffer& buf) {
  fail_launch = launches.size() + 1;  // the second tensor's kernel
  const std::vector<commd::CoalescedTensor> tensors = {{0, 100, commd::DataType::kFloat32},
                                                       {512, 100, commd::DataType::kFloat32},
                                                       {1024, 100, commd::DataType::kFloat32}};
  commd::CollectiveOptions o;
  o.cuda_stream = Stream(0x1000);
  const absl::Status partial = g.AllReduceCoalesced(buf, tensors, commd::ReduceOp::kSum, o);
  if (!absl::IsFailedPrecondition(partial) ||
      !absl::StrContains(partial.message(), "enqueued 1 of its 3 kernels")) {
    return absl::InternalError(absl::StrCat("partial launch: ", partial.ToString()));
  }
  const size_t before = launches.size();
  const absl::Status later = AllReduceOn(g, buf, 0x2000, 16);
  if (!absl::IsFailedPrecondition(later) ||
      !absl::StrContains(later.message(), "barrier counts now differ")) {
    return absl::InternalError(absl::StrCat("call after a partial launch: ", later.ToString()));
  }
  return Expect(launches.size() == before, "a call after the group failed launched a kernel");
}

int Fail(const absl::Status& status) {
  std::printf("ERROR %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cuda_launch_rank GROUP\n");
    return 2;
  }
  commd::kernels::cuda_internal::SetKernelRuntimeForTesting(&kFakeRuntime);
  commd::GroupOptions options;
  options.name = argv[1];
  options.rank = 0;
  options.world_size = 1;
  options.device = commd::Device::Cuda(0);
  options.timeout = absl::Seconds(60);
  auto client = commd::Client::Connect({});
  if (!client.ok()) return Fail(client.status());
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) return Fail(group.status());
  auto buf = (*group)->AllocateSymmetric(1 << 16);
  if (!buf.ok()) return Fail(buf.status());
  for (auto step : {&ScratchPerStream, &CaptureRefused, &PartialLaunchFailsTheGroup}) {
    if (auto s = step(**group, **buf); !s.ok()) return Fail(s);
  }
  std::printf("OK\n");
  std::fflush(stdout);
  return 0;
}
