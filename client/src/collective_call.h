// Internal to the SDK: the one path of every collective of a Group.
//
//   Group::AllReduce(buf, n, t, op, o)  ->  Group::Run(CollectiveCall{kAllReduce, &buf, &buf, n, t,
//   op, o})
//     Run (collectives.cc): checks the arguments (CheckCall), resolves the buffers' cached
//     views and the all-reduce algorithm, prepares the flight-recorder entry (CollectiveEntry),
//     and hands the call to the group's CollectiveBackend:
//       host (host_collectives.cc): kernels/host now, between the entry's transitions; the
//         kernels run the cross-rank call check;
//       CUDA (cuda_collectives.cc, only in builds with CUDA): kernels/cuda enqueued on the
//         caller's stream, recorded stream-ordered.
//
// The backend is chosen once, when the group is joined, from the group's device. Adding a
// collective is one row of the shape table (collectives.cc) and one case per backend.
//
// Nothing here allocates or formats on the success path: views are built once per buffer
// (BufferViews, at allocation), tensor descriptors live on the stack in the ring's own form
// (RecordTensor), messages are built only for errors, and a call equal to the last one
// checked on its buffer skips the argument checks (CheckedKey). bench/sdk_call_cost.py
// counts what is left, by function (docs/PERFORMANCE.md "The SDK's own work per call").
#ifndef COMMD_CLIENT_SRC_COLLECTIVE_CALL_H_
#define COMMD_CLIENT_SRC_COLLECTIVE_CALL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/src/recorder_impl.h"
#include "commd/collective_op.h"
#include "commd/group.h"
#include "commd/recorder.h"
#include "commd/v1/groups.pb.h"
#include "common/control_block.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd {

struct PeerProcesses;

// The fused matmuls' operands (collective_op.h kAllGatherMatmul, kMatmulReduceScatter).
struct MatmulCall {
  size_t rows = 0;
  size_t k = 0;
  std::span<const MatmulB> bs;  // all-gather + matmul: 1..8; matmul + reduce-scatter: 1
  const float* row_scale = nullptr;
  void* gathered = nullptr;  // all-gather + matmul
  const void* a = nullptr;   // matmul + reduce-scatter
};

// One collective call as the public API describes it.
struct CollectiveCall {
  CollectiveOp kind = CollectiveOp::kBarrier;
  SymmetricBuffer* in = nullptr;   // in-place collectives and barrier: the buffer
  SymmetricBuffer* out = nullptr;  // in-place collectives and barrier: == in
  size_t count = 0;                // elements per rank, as the public call's count
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;              // reducing collectives only
  int root = -1;                             // broadcast only
  std::span<const CoalescedTensor> tensors;  // kAllReduceCoalesced only: tensors of `in`
  // The host-memory overloads: the data are `input` and `output` (broadcast: both the one
  // buffer), and `in` == `out` is the staging buffer the kernels stage `input` into.
  bool host_memory = false;
  const void* input = nullptr;
  void* output = nullptr;
  const CollectiveOptions* options = nullptr;  // never null
  const MatmulCall* matmul = nullptr;          // the fused matmuls only
};

// What the result of Group::Run's argument checks depends on, for a call whose one buffer
// (in == out: the in-place collectives, barrier, the host-memory overloads' staging buffer)
// is `in`, neither coalesced nor fused, once the buffer is known to be the calling group's
// (Group::owns, compared first: another group's call never reads this key): the call's
// shape and its host pointers. The buffer's size, owner and views and the group's settings
// do not change while the buffer lives, so a call equal to the buffer's last checked one
// skips the checks (its options are still checked on every call).
struct CheckedKey {
  bool valid = false;  // false: nothing checked yet
  CollectiveOp kind = CollectiveOp::kBarrier;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;
  bool host_memory = false;
  const void* input = nullptr;
  const void* output = nullptr;
  bool operator==(const CheckedKey&) const = default;
};

// The pointers a view borrows, for one buffer: built once when the buffer is mapped, so that
// a collective copies a view instead of building one.
struct BufferViews {
  std::vector<std::byte*> data;  // by rank
  std::vector<uint32_t*> pads;   // by rank
  // Every field but the group's (abort word, heartbeat) and the call's (deadline).
  kernels::HostCommView host;
};

// What a checked call resolved to, for the backend.
struct CheckedCall {
  const CollectiveCall& call;
  const BufferViews& views;                 // of call.in: its peers and signal pads form the view
  const BufferViews* out_views = nullptr;   // of call.out
  const BufferViews* span_words = nullptr;  // a spanning group's words (span_collectives.h)
  kernels::Algorithm algorithm = kernels::Algorithm::kTwoShot;  // all-reduce only
  absl::Duration wait;                                          // how long each wait may take
};

// The flight-recorder entry of one call, with the group's NaN policy around it. The funnel
// makes it; the backend marks its transitions where they happen (the host now, CUDA in
// stream order). Tensor descriptors are kept here (at most kRecordMaxTensors a side, what
// the ring records).
class CollectiveEntry {
 public:
  struct GroupParts {
    Group& group;
    Recorder::Impl& recorder;
    const v1::CollectiveSettings& settings;
    const PeerProcesses& peers;
    uint64_t timeout_ms;  // the group's timeout, recorded as the entry's
  };
  CollectiveEntry(const GroupParts& g, const CollectiveCall& call);
  CollectiveEntry(const CollectiveEntry&) = delete;  // the descriptors point into it
  CollectiveEntry& operator=(const CollectiveEntry&) = delete;

  // Records the entry as scheduled (Begin) or scheduled and started (one clock read), and
  // resolves whether this call checks its input for NaN/Inf.
  void Begin();
  void BeginStarted();
  const RecordId& id() const { return id_; }
  kernels::NanCheck nan() const { return nan_; }
  Recorder& recorder() { return g_.group.recorder(); }
  Recorder::Impl& recorder_impl() { return g_.recorder; }
  Group& group() { return g_.group; }
  const v1::CollectiveSettings& settings() const { return g_.settings; }

  // Ends a call that ran on this thread: counts the NaN check, applies the group's NaN
  // policy, says why a wait failed (abort reason, exited peer), completes or abandons the
  // entry and fills the options' nonfinite outputs.
  absl::Status Finish(absl::Status status, const kernels::CollectiveResult& result);

 private:
  absl::Status Explain(absl::Status status) const;
  RecordArgs Args() const;
  void Began(const RecordHandle& h);
  GroupParts g_;
  const CollectiveCall& call_;
  RecordHandle handle_;  // the ring writer's, kept for the transitions
  RecordId id_;          // the same entry, as the public Recorder names it
  kernels::NanCheck nan_ = kernels::NanCheck::kOff;
  // The entry's tensors in the ring's own form, handed to the ring writer as they are (no
  // conversion per call).
  // Only the first n_in_ / n_out_ are written and read: left uninitialised (zeroing the
  // arrays was a sixth of the SDK's own work per call).
  union Tensors {
    Tensors() {}  // NOLINT: no member initialised
    RecordTensor t[kRecordMaxTensors];
  };
  int64_t dims_[2 * kRecordMaxTensors];
  Tensors in_, out_;
  size_t n_in_ = 0, n_out_ = 0;
};

// How a group's collectives run on its device.
class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  // Runs (host) or enqueues (CUDA) `c`, its arguments checked, as the one entry `entry`.
  virtual absl::Status Run(const CheckedCall& c, CollectiveEntry& entry) = 0;
};

// Host buffers: kernels/host over the buffers' views, with the group's control block's
// abort word and heartbeat (null when the block is too small to hold them).
std::unique_ptr<CollectiveBackend> MakeHostBackend(const uint32_t* abort_word,
                                                   uint64_t* heartbeat_ns);

// Whether collective `seq` checks its input: the call's choice, else the group's.
kernels::NanCheck ResolveNanCheck(const CollectiveOptions& o, const v1::CollectiveSettings& group,
                                  uint64_t seq);

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_COLLECTIVE_CALL_H_
