// What the modes of collective_rank (collective_rank.cc) share with the host-memory modes
// (collective_rank_host.cc): the rank's Run, the inputs regenerated from the shared seed and
// the checks against the float64 reference.
#ifndef COMMD_TESTS_INTEGRATION_COLLECTIVE_RANK_H_
#define COMMD_TESTS_INTEGRATION_COLLECTIVE_RANK_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "commd/commd.h"
#include "tests/integration/typed_elements.h"

namespace collective_rank {

using commd::DataType;
using commd::ReduceOp;

// The GPU of rank `rank` in the CUDA modes: rank / COMMD_GPU_RANKS_PER_GPU (the test sets it;
// 1 when unset), so on one GPU every rank shares device 0 (issue #36) and on N GPUs rank r
// has GPU r as before.
inline int GpuOfRank(int rank) {
  const char* env = std::getenv("COMMD_GPU_RANKS_PER_GPU");
  const int per_gpu = env == nullptr ? 1 : std::atoi(env);
  return per_gpu > 1 ? rank / per_gpu : rank;
}

// The command line.
struct Args {
  int rank = 0;
  int world = 0;
  uint64_t seed = 0;
  std::string mode;      // as given: "repeat:2000"
  std::string name;      // the table's key: "repeat"
  std::string argument;  // after the ':', empty without one: "2000"
};

// One rank's run of a mode: its arguments, client, group and two symmetric buffers, and
// what it found wrong so far.
struct Run {
  const Args& args;
  commd::Client& client;
  commd::Group& g;
  commd::SymmetricBuffer& in;
  commd::SymmetricBuffer& out;
  int failures = 0;
  uint64_t tag = 0;  // distinguishes the inputs of successive collectives
  // Host-memory modes: collectives read user_in and write user_out (ordinary memory), with
  // `in` as the staging buffer.
  bool host_memory = false;
  std::vector<uint64_t> user_in, user_out;
  // CUDA fused-matmul mode: the stream its calls are enqueued on (operands in device memory).
  void* cuda_stream = nullptr;

  // Where a collective's input and output are: the user's memory or the symmetric buffers.
  void* input() { return host_memory ? static_cast<void*>(user_in.data()) : in.data(); }
  void* output() { return host_memory ? static_cast<void*>(user_out.data()) : out.data(); }
  size_t bytes() const { return in.size(); }

  void Fail(const std::string& what) {
    if (++failures <= 20) std::printf("rank %d: FAIL %s\n", args.rank, what.c_str());
  }
  void Check(const char* what, absl::Status s) {
    if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
  }
};

using commd::testing::Load;
using commd::testing::Narrow;
using commd::testing::Size;
using commd::testing::Store;
// Input value i of rank r for test `tag` (exactly representable in the type).
double Input(const Run& run, int r, uint64_t tag, size_t i, DataType t);
void Poison(void* p, size_t bytes);
// Fail `what` unless the result matches the reference of `tag`: `n` reduced elements from
// reference element `first`; every rank's `n` inputs by rank; chunk p = chunk `rank` of rank
// p's inputs.
void ExpectReduced(Run& run, const std::string& what, const void* got, uint64_t tag, size_t first,
                   size_t n, DataType t, ReduceOp op);
void ExpectGathered(Run& run, const std::string& what, const void* got, uint64_t tag, size_t n,
                    DataType t);
void ExpectExchanged(Run& run, const std::string& what, const void* got, uint64_t tag, size_t n,
                     DataType t);
// Fails `what` unless `s` is INVALID_ARGUMENT with `needle` in its message.
void ExpectInvalid(Run& run, const char* what, const absl::Status& s, const char* needle);

// Modes (collective_rank.cc).
void Matrix(Run& run);
void Large(Run& run);
// Fused-matmul modes (collective_rank_matmul.cc).
void FusedMatmul(Run& run);
void CudaFusedMatmul(Run& run);
void FusedMatmulInvalid(Run& run);
void FusedMatmulNanFail(Run& run);
void FusedMatmulMissingRank(Run& run);
// Host-memory modes (collective_rank_host.cc).
void HostMatrix(Run& run);
void HostLarge(Run& run);
void HostOverlapping(Run& run);
void HostInvalid(Run& run);
void HostNanFail(Run& run);

// Parts of one flight-recorder entry (collective_rank_parts.cc).
void PartOf(Run& run);
void PartOfNanFail(Run& run);

}  // namespace collective_rank

#endif  // COMMD_TESTS_INTEGRATION_COLLECTIVE_RANK_H_
