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
// (TensorDesc), messages are built only for errors, and a call equal to the last one
// checked on its buffer skips the argument checks and records the entry's shape prepared
// with it (PreparedCall). bench/sdk_call_cost.py
// counts what is left, by function (docs/PERFORMANCE.md "The SDK's own work per call").
#ifndef COMMD_CLIENT_SRC_COLLECTIVE_CALL_H_
#define COMMD_CLIENT_SRC_COLLECTIVE_CALL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
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
#include "kernels/host/plan.h"
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

// The flight-recorder entry's tensors of one call in the ring's own form (at most
// kRecordMaxTensors a side, what the ring records), handed to the ring writer as they are.
// Only the first n_in / n_out are written and read: left uninitialised (zeroing the arrays
// was a sixth of the SDK's own work per call). Not copyable: Args() points into it.
class EntryTensors {
 public:
  EntryTensors() {}  // NOLINT: no member initialised
  EntryTensors(const EntryTensors&) = delete;
  EntryTensors& operator=(const EntryTensors&) = delete;
  // The call's tensors as the entry records them; `world` is the group's global world size.
  void Fill(const CollectiveCall& call, int64_t world);
  // The entry's arguments over these tensors.
  RecordArgs Args(CollectiveOp kind, uint64_t timeout_ms) const;

 private:
  union Tensors {
    Tensors() {}  // NOLINT: no member initialised
    TensorDesc t[kRecordMaxTensors];
  };
  int64_t dims_[2 * kRecordMaxTensors];
  Tensors in_, out_;
  size_t n_in_ = 0, n_out_ = 0;
};

// What the last call on one buffer that passed Group::Run's checks resolved to, kept with
// the buffer so that an equal call (`key`) skips the checks and records a prepared entry:
// its all-reduce algorithm, its flight-recorder entry's shape (RecordShape: the ring
// writes the shape's fields into a slot only when the slot does not hold them already) and,
// for the host all-reduce, the kernels' prepared call (validated, staging planned, call words
// hashed), which the host backend makes on the first run of the key and runs while it holds.
// Not copyable: `shape` points into `tensors`.
struct PreparedCall {
  CheckedKey key;
  kernels::Algorithm algorithm = kernels::Algorithm::kTwoShot;
  EntryTensors tensors;
  RecordShape shape;
  kernels::PreparedCollective kernel;  // over the buffer's views.host; valid when kernel_ready
  bool kernel_ready = false;           // reset whenever `key` changes
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
  // The buffer's prepared call when `call` is its key (one buffer, this group's), else null.
  PreparedCall* prepared = nullptr;
  absl::Duration wait;  // how long each wait may take
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
  // `prepared`: the entry's shape when the call is its buffer's prepared one (PreparedCall),
  // else null (the entry's tensors are built here). Borrowed for the entry's life.
  // `g` is borrowed for the entry's life (the group's own, Group::State::entry_parts).
  CollectiveEntry(const GroupParts& g, const CollectiveCall& call, const RecordShape* prepared);
  CollectiveEntry(const CollectiveEntry&) = delete;  // the descriptors point into it
  CollectiveEntry& operator=(const CollectiveEntry&) = delete;

  // Records the entry as scheduled (Begin) or scheduled and started (one clock read). Once
  // per call: the backend's, before the call can wait (the host's while its message is out).
  // A part (CollectiveOptions::part_of) records nothing: it only marks the rank alive.
  void Begin();
  void BeginStarted();
  bool begun() const { return begun_; }
  // The call's entry: its own, or for a part the part_of entry.
  RecordId id() const { return Recorder::Impl::Id(handle_); }
  // Whether the call is a part of an entry recorded by hand (CollectiveOptions::part_of).
  bool part() const { return part_; }
  // The transitions of a call enqueued on a CUDA stream, written in stream order
  // (Recorder::Started / Completed with the stream). A part writes none: its part_of entry's
  // are the caller's, enqueued on the same stream around the parts; the part marks the rank
  // alive instead, as on the host.
  absl::Status StartedOnStream(void* cuda_stream);
  absl::Status CompletedOnStream(void* cuda_stream);
  // Retires the entry of a call that failed as abandoned. A part, failed or not, leaves its
  // part_of entry to the caller and only marks the rank alive.
  void Abandon();
  // Whether this call checks its input for NaN/Inf: known from construction (by the seq the
  // entry will get), so that a backend may stage the input before recording.
  kernels::NanCheck nan() const { return nan_; }
  Recorder& recorder() { return g_.group.recorder(); }
  Recorder::Impl& recorder_impl() { return g_.recorder; }
  Group& group() { return g_.group; }
  const v1::CollectiveSettings& settings() const { return g_.settings; }

  // Ends a call that ran on this thread: counts the NaN check, applies the group's NaN
  // policy, says why a wait failed (abort reason, exited peer), completes or abandons the
  // entry (a part leaves its part_of entry to the caller) and fills the options' nonfinite
  // outputs.
  absl::Status Finish(absl::Status status, const kernels::CollectiveResult& result) {
    // The common case inline: succeeded, nothing to count or flag.
    if (status.ok() && nan_ == kernels::NanCheck::kOff && result.nonfinite_ranks == 0 && !part_) {
      g_.recorder.writer->Completed(handle_);
      SetOutputs(result);
      return status;
    }
    return FinishAny(std::move(status), result);
  }

 private:
  absl::Status FinishAny(absl::Status status, const kernels::CollectiveResult& result);
  void SetOutputs(const kernels::CollectiveResult& result) const {
    const CollectiveOptions& o = *call_.options;
    if (o.nonfinite_count != nullptr) *o.nonfinite_count = result.nonfinite_count;
    if (o.nonfinite_ranks != nullptr) *o.nonfinite_ranks = result.nonfinite_ranks;
  }
  absl::Status Explain(absl::Status status) const;
  void Began(const RecordHandle& h);
  bool BeganAsPart();  // a part: marks the rank alive instead of recording; false otherwise
  const GroupParts& g_;
  const CollectiveCall& call_;
  RecordHandle handle_;  // the ring writer's, kept for the transitions; a part's: part_of's
  bool begun_ = false;
  bool part_ = false;
  kernels::NanCheck nan_ = kernels::NanCheck::kOff;
  const RecordShape* shape_;  // the prepared one, or own_shape_
  EntryTensors own_tensors_;  // not prepared: the call's, built here
  // Not prepared: over own_tensors_ (id 0: written in full). Optional so that a prepared
  // call does not initialise it.
  std::optional<RecordShape> own_shape_;
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
