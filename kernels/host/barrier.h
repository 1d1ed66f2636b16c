// The CPU barrier over a symmetric allocation's signal pads (protocol: kernels/signal_layout.h).
//
//   RETURN_IF_ERROR(HostBarrier(view, "all_reduce"));   // every rank's data is ready
//
// Blocks until every rank of the view has arrived at the same barrier, the abort word is set
// (ABORTED) or the view's deadline passes (DEADLINE_EXCEEDED naming the ranks that did not
// arrive). Waits spin briefly, then sleep on a shared futex, so ranks may outnumber cores.
// Everything a rank wrote before arriving is visible to every rank after it leaves.
// One thread per rank and allocation at a time; the view must have been validated.
#ifndef COMMD_KERNELS_HOST_BARRIER_H_
#define COMMD_KERNELS_HOST_BARRIER_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/host/comm_view.h"

namespace commd::kernels {

// `collective` names the caller in error messages ("all_reduce", "barrier").
absl::Status HostBarrier(const HostCommView& view, absl::string_view collective);

// One barrier taken apart, for collectives that start on a peer's data as soon as that peer
// has arrived (the fused all-gather + matmul): constructing it arrives; WaitFor(p) returns
// once rank p has arrived, with HostBarrier's errors. A round is one barrier: every rank
// must take it where its peers run HostBarrier or a round. World size above 1.
//
//   HostBarrierRound round(view, "all_gather_matmul");   // this rank's shard is ready
//   for (...) { RETURN_IF_ERROR(round.WaitFor(p)); Use(p); }
class HostBarrierRound {
 public:
  HostBarrierRound(const HostCommView& view, absl::string_view collective);
  ~HostBarrierRound();
  HostBarrierRound(const HostBarrierRound&) = delete;
  HostBarrierRound& operator=(const HostBarrierRound&) = delete;

  absl::Status WaitFor(int peer);
  absl::Status WaitForAll();

 private:
  std::atomic_ref<uint32_t> Slot(int peer) const;
  std::atomic_ref<uint32_t> SleepFlag() const;
  absl::Status Failure(int peer, bool aborted) const;

  const HostCommView& view_;
  absl::string_view collective_;
  uint32_t target_ = 0;
  bool sleeping_ = false;
  absl::Time last_beat_ = absl::InfinitePast();
  // The barrier's deadline: the view's, or wait_limit after the first wait that needed the
  // clock (InfinitePast until then).
  absl::Time deadline_ = absl::InfinitePast();
};

// ABORTED when the view's abort word is set (checked on entry to every collective).
absl::Status CheckNotAborted(const HostCommView& view, absl::string_view collective);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_BARRIER_H_
