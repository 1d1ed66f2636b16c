// One rank of a group spanning nodes on CUDA memory, on tests/fixtures/fake_libcuda (the
// daemons' and this process's driver) and tests/fixtures/fake_libnccl (COMMD_NCCL_LIBRARY;
// it logs every NCCL call to COMMD_FAKE_NCCL_CALL_LOG), with only the node-local kernel launch
// replaced at the CUDA runtime boundary (kernels::cuda_internal::SetKernelRuntimeForTesting).
// Everything else is the real SDK: the agreement through host words and gloo between the
// nodes, the plan, the NCCL communicators' rendezvous through the job's store, the recorder's
// stream-ordered writes. Only the driver's copies move data (the fakes run no kernel and NCCL
// moves nothing); kernels/span_plan_test checks what the steps compute.
//
//   cuda_span_rank GROUP RANK WORLD GLOBAL_RANK GLOBAL_WORLD TIMEOUT_MS LEAVE_FILE MODE
//
// Joins on cuda:RANK, prints "joined", runs MODE, printing a line per call
// ("<name> <CODE> <message>") and each node-local launch ("launch <collective> count=<n>
// root=<r> offset=<bytes>"):
//   calls    all-reduce of 1000 fp32 (sum); all-gather, reduce-scatter (sum) and all-to-all of
//            10 fp32 per block, printing the output the fake driver's copies wrote
//            ("reduce_scatter_out <10 values>", a barrier, "all_to_all_out <element 0 of each
//            block>");
//            an all-gather of 9 on the last global rank and 10 elsewhere (refused everywhere);
//            an all-reduce of 1000 fp32 with 999 on the last global rank (refused everywhere),
//            broadcast of 10 int32 from global rank 1, all-reduce avg of 6 fp32, barrier,
//            all-reduce of 1048577 fp32 (lanes)
//   uneven   all-reduce of 1048577 fp32 (the leaders: nodes of unequal size), broadcast of 10
//            int32 from the last global rank
//   blocks   the all-gather, reduce-scatter and all-to-all of "calls"
//   nan      (the 3-node layout of global ranks {3}, {0, 5}, {1, 2, 4}) NaN/Inf checks on,
//            policy report: all-to-all of 10 fp32 per block with one NaN in global rank 5's
//            input ("a2a_far"), in global rank 3's (alone on its node: "a2a_alone"), in none
//            ("a2a_clean"); all-reduce of 1000 ("ar_alone"), all-gather of 10
//            ("ag_alone"), reduce-scatter of 10 per block ("rs_alone") and broadcast of 10
//            from global rank 3 ("bcast_alone") with one NaN in global rank 3's input; a
//            barrier ("sync", which retires the calls before it); then group "f" (policy fail)
//            and its all-to-all with the check on ("fail")
//   no-nccl  one all-reduce (COMMD_NCCL_LIBRARY names no library)
//   twice    two all-reduces ("all_reduce", then "again"), the second made at once
// Prints "done", waits for the group's abort or LEAVE_FILE, prints "left", exits 0 two seconds
// later.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "kernels/cuda/collectives.h"

namespace {

using commd::DataType;
using commd::ReduceOp;
using commd::kernels::cuda_internal::KernelRuntime;
using commd::kernels::cuda_internal::LaunchArgs;

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

const char* Name(commd::CollectiveOp op) {
  switch (op) {
    case commd::CollectiveOp::kBarrier:
      return "barrier";
    case commd::CollectiveOp::kAllReduce:
      return "all_reduce";
    case commd::CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case commd::CollectiveOp::kBroadcast:
      return "broadcast";
    case commd::CollectiveOp::kAllGather:
      return "all_gather";
    case commd::CollectiveOp::kAllToAll:
      return "all_to_all";
    default:
      return "other";
  }
}

// The kernels' NaN/Inf count (kernels/cuda/collectives.cu, fused into their copy-in): the
// elements of this rank's input each kernel reads, added to the view's counter (the fake
// driver's device memory and mapped host words are this process's). fp32 only, as the modes.
void FakeCount(const commd::kernels::CudaCommView& v, const LaunchArgs& a) {
  if (a.nan_check != commd::kernels::NanCheck::kOn || v.nonfinite_count == nullptr ||
      a.dtype != commd::DataType::kFloat32 || a.input == nullptr) {
    return;
  }
  size_t n = a.count;
  if (!a.count_only && (a.collective == commd::CollectiveOp::kReduceScatter ||
                        a.collective == commd::CollectiveOp::kAllToAll)) {
    n *= static_cast<size_t>(v.world_size);
  }
  if (!a.count_only && a.collective == commd::CollectiveOp::kBroadcast && v.rank != a.root) return;
  unsigned long long bad = 0;
  for (size_t e = 0; e < n; ++e)
    bad += std::isfinite(static_cast<const float*>(a.input)[e]) ? 0 : 1;
  std::atomic_ref<unsigned long long>(*v.nonfinite_count).fetch_add(bad);
}

cudaError_t FakeLaunch(const commd::kernels::CudaCommView& v, const LaunchArgs& a, cudaStream_t) {
  Print(absl::StrCat("launch ", a.count_only ? "count_nonfinite" : Name(a.collective),
                     " count=", a.count, " root=", a.root, " offset=", a.offset));
  FakeCount(v, a);
  return cudaSuccess;
}
cudaError_t FakePreload() { return cudaSuccess; }
const KernelRuntime kFakeRuntime{&FakeLaunch, &FakePreload};

void Said(const std::string& what, const absl::Status& s) {
  Print(absl::StrCat(what, " ", absl::StatusCodeToString(s.code()), " ", s.message()));
}

// All-gather, reduce-scatter and all-to-all of 10 fp32 per block on the caller's stream.
void Blocks(commd::Group& g, commd::SymmetricBuffer& a, commd::SymmetricBuffer& b, int global_rank,
            int global_world) {
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  Said("all_gather", g.AllGather(a, b, 10, DataType::kFloat32, o));
  // The fake driver's copies move data (its device memory is this process's): input element e
  // of global rank r holds r * 1000 + e, so where each copy read from shows in the output.
  auto* in = static_cast<float*>(a.data());
  auto* out = static_cast<float*>(b.data());
  const auto fill = [&] {
    for (int e = 0; e < 10 * global_world; ++e) in[e] = static_cast<float>(global_rank * 1000 + e);
    for (int e = 0; e < 10 * global_world; ++e) out[e] = -1;
  };
  fill();
  Said("reduce_scatter", g.ReduceScatter(a, b, 10, DataType::kFloat32, ReduceOp::kSum, o));
  Print(absl::StrCat("reduce_scatter_out ", absl::StrJoin(out, out + 10, ",")));
  fill();
  Said("all_to_all", g.AllToAll(a, b, 10, DataType::kFloat32, o));
  // The peers' copies into this output ran (at once, on the fake) before they entered this
  // barrier's agreement: the fake kernels order nothing.
  Said("sync", g.Barrier());
  std::vector<float> blocks;  // element 0 of each block of the output
  for (int r = 0; r < global_world; ++r) blocks.push_back(out[r * 10]);
  Print(absl::StrCat("all_to_all_out ", absl::StrJoin(blocks, ",")));
}

void Calls(commd::Group& g, commd::SymmetricBuffer& a, commd::SymmetricBuffer& b, int global_rank,
           int global_world) {
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  Said("all_reduce", g.AllReduce(a, 1000, DataType::kFloat32, ReduceOp::kSum, o));
  Blocks(g, a, b, global_rank, global_world);
  Said("mismatch_gather",
       g.AllGather(a, b, global_rank == global_world - 1 ? 9 : 10, DataType::kFloat32, o));
  Said("mismatch", g.AllReduce(a, global_rank == global_world - 1 ? 999 : 1000, DataType::kFloat32,
                               ReduceOp::kSum, o));
  Said("broadcast", g.Broadcast(a, 10, DataType::kInt32, 1, o));
  Said("avg", g.AllReduce(a, 6, DataType::kFloat32, ReduceOp::kAvg, o));
  Said("barrier", g.Barrier());
  Said("lanes", g.AllReduce(a, 1048577, DataType::kFloat32, ReduceOp::kSum, o));
}

// See "nan" above: one NaN at input element 3 of global rank `who` (-1: none), the rest finite.
void Plant(commd::SymmetricBuffer& a, size_t n, int global_rank, int who) {
  auto* in = static_cast<float*>(a.data());
  for (size_t e = 0; e < n; ++e) in[e] = static_cast<float>(e);
  if (global_rank == who) in[3] = std::nanf("");
}

void Nans(commd::Group& g, commd::SymmetricBuffer& a, commd::SymmetricBuffer& b, int global_rank,
          int global_world) {
  commd::CollectiveOptions o;
  o.cuda_stream = reinterpret_cast<void*>(0x1000);
  o.nan_check = commd::NanCheck::kOn;
  const size_t wide = 10 * static_cast<size_t>(global_world);
  Plant(a, wide, global_rank, 5);
  Said("a2a_far", g.AllToAll(a, b, 10, DataType::kFloat32, o));
  Plant(a, wide, global_rank, 3);
  Said("a2a_alone", g.AllToAll(a, b, 10, DataType::kFloat32, o));
  Plant(a, wide, global_rank, -1);
  Said("a2a_clean", g.AllToAll(a, b, 10, DataType::kFloat32, o));
  Plant(a, 1000, global_rank, 3);
  Said("ar_alone", g.AllReduce(a, 1000, DataType::kFloat32, ReduceOp::kSum, o));
  Plant(a, 10, global_rank, 3);
  Said("ag_alone", g.AllGather(a, b, 10, DataType::kFloat32, o));
  Plant(a, wide, global_rank, 3);
  Said("rs_alone", g.ReduceScatter(a, b, 10, DataType::kFloat32, ReduceOp::kSum, o));
  Plant(a, 10, global_rank, 3);
  Said("bcast_alone", g.Broadcast(a, 10, DataType::kFloat32, 3, o));
  Said("sync", g.Barrier());
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0, world = 0, global_rank = 0, global_world = 0;
  int64_t timeout_ms = 0;
  if (argc != 9 || !absl::SimpleAtoi(argv[2], &rank) || !absl::SimpleAtoi(argv[3], &world) ||
      !absl::SimpleAtoi(argv[4], &global_rank) || !absl::SimpleAtoi(argv[5], &global_world) ||
      !absl::SimpleAtoi(argv[6], &timeout_ms)) {
    std::fprintf(stderr,
                 "usage: cuda_span_rank GROUP RANK WORLD GLOBAL_RANK GLOBAL_WORLD TIMEOUT_MS "
                 "LEAVE_FILE MODE\n");
    return 2;
  }
  commd::kernels::cuda_internal::SetKernelRuntimeForTesting(&kFakeRuntime);
  const std::string mode = argv[8];
  const char* job = std::getenv("COMMD_JOB_ID");
  auto client = commd::Client::Connect({.job_id = job == nullptr ? "job" : job});
  if (!client.ok()) {
    Said("connect", client.status());
    return 1;
  }
  auto group = (*client)->JoinGroup({.name = argv[1],
                                     .rank = rank,
                                     .world_size = world,
                                     .global_rank = global_rank,
                                     .global_world_size = global_world,
                                     .device = commd::Device::Cuda(rank),
                                     .timeout = absl::Milliseconds(timeout_ms)});
  if (!group.ok()) {
    Said("join", group.status());
    return 1;
  }
  commd::Group& g = **group;
  Print("joined");
  auto a = g.AllocateSymmetric(1048577 * 4);
  auto b = g.AllocateSymmetric(4096);
  if (!a.ok() || !b.ok()) {
    Said("allocate", a.ok() ? b.status() : a.status());
    return 1;
  }
  if (mode == "calls") {
    Calls(g, **a, **b, global_rank, global_world);
  } else if (mode == "nan") {
    Nans(g, **a, **b, global_rank, global_world);
    auto f = (*client)->JoinGroup({.name = "f",
                                   .rank = rank,
                                   .world_size = world,
                                   .global_rank = global_rank,
                                   .global_world_size = global_world,
                                   .device = commd::Device::Cuda(rank),
                                   .timeout = absl::Milliseconds(timeout_ms),
                                   .nan_policy = commd::GroupOptions::NanPolicy::kFail});
    if (!f.ok()) {
      Said("join_f", f.status());
    } else {
      auto fa = (*f)->AllocateSymmetric(4096);
      auto fb = (*f)->AllocateSymmetric(4096);
      if (!fa.ok() || !fb.ok()) {
        Said("allocate_f", fa.ok() ? fb.status() : fa.status());
      } else {
        commd::CollectiveOptions o;
        o.cuda_stream = reinterpret_cast<void*>(0x1000);
        o.nan_check = commd::NanCheck::kOn;
        Plant(**fa, 10 * static_cast<size_t>(global_world), global_rank, 5);
        Said("fail", (*f)->AllToAll(**fa, **fb, 10, DataType::kFloat32, o));
      }
    }
  } else if (mode == "blocks") {
    Blocks(g, **a, **b, global_rank, global_world);
  } else if (mode == "uneven") {
    commd::CollectiveOptions o;
    Said("all_reduce", g.AllReduce(**a, 1048577, DataType::kFloat32, ReduceOp::kSum, o));
    Said("broadcast", g.Broadcast(**a, 10, DataType::kInt32, global_world - 1, o));
  } else {
    commd::CollectiveOptions o;
    Said("all_reduce", g.AllReduce(**a, 1000, DataType::kFloat32, ReduceOp::kSum, o));
    if (mode == "twice") {
      Said("again", g.AllReduce(**a, 1000, DataType::kFloat32, ReduceOp::kSum, o));
    }
  }
  Print("done");
  const std::string leave = argv[7];
  while (!g.abort_requested() && ::access(leave.c_str(), F_OK) != 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (g.abort_requested()) absl::SleepFor(absl::Milliseconds(200));  // the hook's Close ran
  Print("left");
  // The group (and its communicators, which its destruction aborts too) stays a while, so that
  // a test reading the NCCL log at "left" sees what the abort itself did.
  absl::SleepFor(absl::Seconds(2));
  return 0;
}
