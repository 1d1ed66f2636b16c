// Internal to the SDK, built only with CUDA: the NCCL communicator of one rank's lane of a group
// spanning nodes on CUDA memory (local rank l with rank l of every node; NCCL rank = node
// index), and the NCCL steps of a plan (kernels/span_plan.h) enqueued on it. The CUDA span
// part (cuda_span_collectives.h) holds one beside the group's SpanAgreement.
//
// The communicator is made by the lane's first step that needs it: node 0's rank l asks NCCL
// for a unique id and puts it in the job's store under
// "commd.span/<group>/<formation>/nccl/<l>", the other nodes' rank l read it,
// ncclCommInitRankConfig (nonblocking) joins them, and node 0's rank deletes the key once every
// member is known to have read it (DeletePublished, after the next call's agreement), or when
// the lane goes. NCCL itself is loaded then (kernels/cuda/nccl_api.h): FAILED_PRECONDITION
// naming COMMD_NCCL_LIBRARY when it is missing. Every NCCL call is made on the nonblocking
// communicator and polled (WaitNccl), so no thread sits in NCCL when Close aborts it.
//
//   SpanNcclLane lane(agreement);
//   RETURN_IF_ERROR(lane.Poll());                  // before the call's agreement
//   RETURN_IF_ERROR(lane.Collective(step, region, scratch, stream));
//
// A failure fails the lane for good (every later call gets it). Thread-safe: Close may come
// from the client's event thread while the calling thread polls.
#ifndef COMMD_CLIENT_SRC_CUDA_SPAN_NCCL_H_
#define COMMD_CLIENT_SRC_CUDA_SPAN_NCCL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/src/span_agreement.h"
#include "kernels/cuda/nccl_api.h"
#include "kernels/span_plan.h"

namespace commd {

class SpanNcclLane {
 public:
  // `agreement` (its setup; its abort requests) is borrowed for the lane's life.
  explicit SpanNcclLane(const SpanAgreement& agreement);
  // The group's enqueued work has finished (the CUDA backend's state waits for it first), so
  // aborting frees the communicator without waiting on peers that may be gone (as PyTorch's
  // ProcessGroupNCCL does; ncclCommDestroy could wait for them forever).
  ~SpanNcclLane();
  SpanNcclLane(const SpanNcclLane&) = delete;
  SpanNcclLane& operator=(const SpanNcclLane&) = delete;

  // An asynchronous NCCL error (a peer or the network gone) fails the group for good here and
  // asks the daemon to abort it everywhere; the lane's earlier failure, if any.
  absl::Status Poll();
  // Deletes the unique id this rank published, once every member is known to have read it
  // (every rank has entered the call after the one that made the communicator).
  void DeletePublished();
  // A kNcclAllReduce or kNcclBroadcast step over this rank's `region` and `scratch`, the
  // communicator made first if need be (blocks until every member joined). Polled to its end.
  absl::Status Collective(const kernels::SpanStep& st, std::byte* region, void* scratch,
                          cudaStream_t stream);
  // A kNcclSendRecv step: its transfers at `at` (one address each, checked by the caller), in
  // one NCCL group.
  absl::Status SendRecv(const kernels::SpanStep& st, std::span<std::byte* const> at,
                        cudaStream_t stream);
  // The group was aborted: stops any NCCL call being polled, aborts the communicator (ending
  // its work still on the device) and fails every later call with ABORTED. Any thread.
  void Close();

 private:
  bool Stop() const;
  void FailLocked(const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EarlierLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Deadline() const { return absl::Now() + s_.connect_wait; }
  absl::Status CommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UniqueId(const std::string& key, absl::Time deadline, ncclUniqueId& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitForKey(const std::string& key, absl::Time deadline) const;
  absl::Status Finish(ncclResult_t first, const std::string& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SpanAgreement& agreement_;
  const SpanSetup& s_;  // the agreement's
  std::atomic<bool> closing_{false};
  absl::Mutex mu_;
  const kernels::NcclApi* nccl_ ABSL_GUARDED_BY(mu_) = nullptr;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // sticky: the lane's communicator is unusable
  absl::Mutex published_mu_;
  std::string published_ ABSL_GUARDED_BY(published_mu_);  // this rank's unique id key, if any
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_CUDA_SPAN_NCCL_H_
