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
// With "parts", instead: two all-reduces as parts of one entry recorded by hand
// (CollectiveOptions::part_of, PartsAreOneEntry); then prints "HOLDING" and waits for the
// file RELEASE to exist, so that the test can read the rank's flight recorder.
// With "status", instead: one all-reduce, printing "RUNTIME <CUDART_VERSION>" and
// "STATUS <its status>" (the test reads what a driver older than the runtime is told).
//
//   cuda_launch_rank GROUP [parts RELEASE | status]
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
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
// What the next launch that checks NaN/Inf finds "on the device": added to the call's counter
// (the fake driver's device address of the SDK's pinned words is their host address).
unsigned long long device_nonfinite = 0;

cudaError_t FakeLaunch(const commd::kernels::CudaCommView& v, const LaunchArgs& a, cudaStream_t s) {
  if (launches.size() == fail_launch) {
    fail_launch = SIZE_MAX;
    return cudaErrorLaunchOutOfResources;
  }
  if (a.nan_check == commd::kernels::NanCheck::kOn && v.nonfinite_count != nullptr) {
    std::atomic_ref(*v.nonfinite_count).fetch_add(device_nonfinite, std::memory_order_release);
    device_nonfinite = 0;
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

// One all-reduce of its own (16 elements; its call registers the control block with the
// group's context, which the fake's cuStreamGetCtx needs current, as a trainer's would be),
// then one of 2048 elements recorded by hand, marked started and completed on stream 0x1000
// around two all-reduce parts of 1024 on that stream (NaN/Inf checked; the second part's
// kernel "finds" 3): the parts launch their kernels there and write no entry. A part
// naming the completed entry, or one never begun, is INVALID_ARGUMENT naming the id with
// nothing launched. Then one all-reduce of its own (16 elements, not checked), whose call
// retires the parts' events and so reports their counts against the entry.
absl::Status PartsAreOneEntry(commd::Group& g, commd::SymmetricBuffer& buf) {
  if (auto s = AllReduceOn(g, buf, 0x1000, 16); !s.ok()) return s;
  void* stream = Stream(0x1000);
  const int64_t dims[] = {2048};
  const commd::TensorDesc t{dims, 1, commd::DataType::kFloat32};
  commd::Recorder& rec = g.recorder();
  const commd::RecordId whole = rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
  if (auto s = rec.Started(whole, stream); !s.ok()) return s;
  commd::CollectiveOptions o;
  o.cuda_stream = stream;
  o.part_of = whole;
  o.nan_check = commd::NanCheck::kOn;
  for (unsigned long long found : {0ULL, 3ULL}) {
    device_nonfinite = found;
    if (auto s = g.AllReduce(buf, 1024, commd::DataType::kFloat32, commd::ReduceOp::kSum, o);
        !s.ok()) {
      return s;
    }
  }
  if (auto s = rec.Completed(whole, stream); !s.ok()) return s;
  if (launches.size() != 3 || launches[1].stream != 0x1000 || launches[2].stream != 0x1000 ||
      launches[2].count != 1024) {
    return absl::InternalError(absl::StrCat(launches.size() - 1, " launches for the two parts"));
  }
  const absl::Status completed =
      g.AllReduce(buf, 1024, commd::DataType::kFloat32, commd::ReduceOp::kSum, o);
  const std::string named =
      absl::StrCat("part_of record ", whole.record_id, " (collective seq ", whole.collective_seq_id,
                   ") is not a pending collective entry of group ", g.name());
  if (!absl::IsInvalidArgument(completed) || !absl::StrContains(completed.message(), named)) {
    return absl::InternalError(absl::StrCat("part of a completed entry: ", completed.ToString()));
  }
  o.part_of = commd::RecordId{.record_id = 77, .collective_seq_id = 9};
  const absl::Status never =
      g.AllReduce(buf, 1024, commd::DataType::kFloat32, commd::ReduceOp::kSum, o);
  if (!absl::IsInvalidArgument(never) ||
      !absl::StrContains(never.message(),
                         "part_of record 77 (collective seq 9) is not a pending")) {
    return absl::InternalError(absl::StrCat("part of an entry never begun: ", never.ToString()));
  }
  if (launches.size() != 3) return absl::InternalError("a refused part launched a kernel");
  if (auto s = AllReduceOn(g, buf, 0x1000, 16); !s.ok()) return s;
  return Expect(launches.size() == 4, absl::StrCat(launches.size(), " launches in all"));
}

// Prints "HOLDING" and waits (at most a minute) for `release` to exist.
absl::Status Hold(const std::string& release) {
  std::printf("HOLDING\n");
  std::fflush(stdout);
  for (int i = 0; i < 6000 && ::access(release.c_str(), F_OK) != 0; ++i) {
    ::usleep(10000);
  }
  return Expect(::access(release.c_str(), F_OK) == 0, "never released");
}

int Fail(const absl::Status& status) {
  std::printf("ERROR %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool parts = argc == 4 && std::string(argv[2]) == "parts";
  const bool status = argc == 3 && std::string(argv[2]) == "status";
  if (argc != 2 && !parts && !status) {
    std::fprintf(stderr, "usage: cuda_launch_rank GROUP [parts RELEASE | status]\n");
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
  if (status) {
    std::printf("RUNTIME %d\nSTATUS %s\n", CUDART_VERSION,
                AllReduceOn(**group, **buf, 0x1000, 16).ToString().c_str());
    std::fflush(stdout);
    return 0;
  }
  if (parts) {
    if (auto s = PartsAreOneEntry(**group, **buf); !s.ok()) return Fail(s);
    if (auto s = Hold(argv[3]); !s.ok()) return Fail(s);
  } else {
    for (auto step : {&ScratchPerStream, &CaptureRefused, &PartialLaunchFailsTheGroup}) {
      if (auto s = step(**group, **buf); !s.ok()) return Fail(s);
    }
  }
  std::printf("OK\n");
  std::fflush(stdout);
  return 0;
}
