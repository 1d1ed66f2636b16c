// The two ways commd-bench runs one collective call over a group's symmetric buffers: the
// SDK's Group collectives (what an application pays) or the host kernels straight (the floor
// the SDK adds its argument checks, flight-recorder entry and settings to). Both use the
// same buffers, the same algorithm and no NaN check, so their difference is the SDK's cost.
//
//   SymmetricBuffers bufs = ...;                  // `in` and, for all-gather/reduce-scatter, `out`
//   std::unique_ptr<CollectivePath> path = MakeCollectivePath(o, Path::kSdk, group, bufs);
//   path->NewSize();
//   RETURN_IF_ERROR(path->Step(size));           // one collective call, blocking
//
// One thread per rank drives a path; the group and buffers must outlive it.
#ifndef COMMD_TOOLS_COMMD_BENCH_COLLECTIVE_PATH_H_
#define COMMD_TOOLS_COMMD_BENCH_COLLECTIVE_PATH_H_

#include <memory>

#include "absl/status/status.h"
#include "commd/group.h"
#include "kernels/types.h"
#include "tools/commd-bench/options.h"

namespace commd::bench {

// `in`: the collective's input (all-reduce: in place). `out`: the all-gather / reduce-scatter
// output, null for the other collectives.
struct SymmetricBuffers {
  SymmetricBuffer* in = nullptr;
  SymmetricBuffer* out = nullptr;
};

class CollectivePath {
 public:
  virtual ~CollectivePath() = default;
  // Before each size's warm-up: the kernel path renews its wait deadline here, outside the
  // timed calls.
  virtual void NewSize() {}
  // One call of the chosen collective for size `s`.
  virtual absl::Status Step(const Size& s) = 0;
};

// `path`: o.path, or either of the two with --path sdk,kernel (both share the buffers).
std::unique_ptr<CollectivePath> MakeCollectivePath(const Options& o, Path path, Group& group,
                                                   const SymmetricBuffers& buffers);

// The all-reduce algorithm both paths use for `bytes` in all (`min_count` elements in the
// smallest tensor): --algo, else the daemon's rule with --one-shot-max-read-bytes.
kernels::Algorithm AllReduceAlgorithm(const Options& o, size_t bytes, size_t min_count);

// The coalesced call's tensors for size `s`: o.tensors equal, consecutive tensors.
std::vector<CoalescedTensor> CoalescedTensors(const Options& o, const Size& s);

}  // namespace commd::bench

#endif  // COMMD_TOOLS_COMMD_BENCH_COLLECTIVE_PATH_H_
