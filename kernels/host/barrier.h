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

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/host/comm_view.h"

namespace commd::kernels {

// `collective` names the caller in error messages ("all_reduce", "barrier").
absl::Status HostBarrier(const HostCommView& view, absl::string_view collective);

// ABORTED when the view's abort word is set (checked on entry to every collective).
absl::Status CheckNotAborted(const HostCommView& view, absl::string_view collective);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_BARRIER_H_
