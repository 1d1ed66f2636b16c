// Groups of ranks on this node and the memory they share.
//
//   commd::GroupOptions opts{.name = "tp", .rank = local_rank, .world_size = 8};
//   ASSIGN_OR_RETURN(auto group, client->JoinGroup(opts));         // blocks until all joined
//   ASSIGN_OR_RETURN(auto buf, group->AllocateSymmetric(1 << 20));  // collective
//   std::memcpy(buf->data(), mine, n);                              // this rank's buffer
//   const void* theirs = buf->peer((group->rank() + 1) % group->world_size());
//
// A Group and its buffers keep their Client's connection alive; destroy them in any order.
// Calls on one Group may come from several threads, but its collectives (Barrier, AllReduce
// and the others, the fused matmuls) one at a time: every rank runs a group's collectives in
// the same order, and the SDK keeps per-group state for them (the flight-recorder writer,
// the last checked call per buffer) without a lock. abort_requested(), abort_reason() and
// SetAbortCallback() may be called at any time.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_GROUP_H_
#define COMMD_CLIENT_INCLUDE_COMMD_GROUP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/device.h"
#include "commd/export.h"
#include "commd/limits.h"
#include "commd/recorder.h"
#include "commd/types.h"

namespace commd {

// One node's part of a group that spans nodes (Group::layout).
struct NodeRanks {
  std::string node;               // the node's name in the cluster (cluster.node_name)
  std::vector<int> global_ranks;  // indexed by the node-local rank
};

// A NaN/Inf check of collective inputs (floating-point types), for a group or one call.
// kDefault: the group's setting for a call, the daemon's config for a group. The values
// follow commd.v1.NanCheck.
enum class NanCheck { kDefault, kOff, kOn, kSampled };

struct GroupOptions {
  std::string name;
  int rank = -1;  // rank within the group on this node
  int world_size = -1;
  int global_rank = -1;  // -1: same as rank; names the flight-recorder file
  // The group's size over every node. 0 (or world_size): the group is on this node only.
  // More: the group spans nodes (docs/cluster.md) and needs the daemon's cluster, else
  // FAILED_PRECONDITION; each rank then gives its global_rank in [0, global_world_size), every
  // rank on every node the same global_world_size (at most kMaxGlobalWorldSize). JoinGroup
  // returns once every node's ranks have joined, with the layout (Group::layout).
  int global_world_size = 0;
  // The process group's description in flight-recorder dumps and `commctl groups` (torch's
  // group_desc: "default_pg", "undefined", ...). At most kMaxGroupDescriptionBytes of
  // printable ASCII, else INVALID_ARGUMENT; every rank must give the same one, else
  // FAILED_PRECONDITION. Empty: "undefined", as PyTorch describes a group without one.
  std::string description;
  Device device = Device::Host();
  // Rendezvous and allocation deadline, and how long a collective may stay pending before
  // the daemon's watchdog calls it hung (capped by watchdog.max_collective_timeout_ms). A
  // collective itself gives up with DEADLINE_EXCEEDED only after twice this, so that the
  // watchdog's diagnosis, dump and policy come first.
  absl::Duration timeout = absl::Minutes(10);
  // What the daemon's watchdog does when this group hangs; the first rank to join decides.
  // kDefault: the daemon's config (watchdog.policy).
  enum class WatchdogPolicy { kDefault, kReport, kNotify, kTerminate };
  WatchdogPolicy watchdog_policy = WatchdogPolicy::kDefault;
  // The group's NaN/Inf check of collective inputs (a call's CollectiveOptions may override
  // it) and what a finding does; the first rank to join decides. kDefault / 0: the daemon's
  // config (collectives.nan_check, .nan_sample_period, .nan_policy).
  using NanCheck = ::commd::NanCheck;
  NanCheck nan_check = NanCheck::kDefault;
  // For kSampled: kMinNanSamplePeriod to kMaxNanSamplePeriod; 0: the daemon's.
  uint32_t nan_sample_period = 0;
  // kReport: count the finding (commd_nan_detected_total) and flag the flight-recorder entry.
  // kFail: also fail the collective on every rank with DATA_LOSS naming the rank(s).
  enum class NanPolicy { kDefault, kReport, kFail };
  NanPolicy nan_policy = NanPolicy::kDefault;
};

// Per-call options of Group's collectives.
struct CollectiveOptions {
  void* cuda_stream = nullptr;  // cudaStream_t for CUDA buffers; ignored for host buffers
  // How long this rank waits for its peers before giving up with DEADLINE_EXCEEDED. Zero:
  // twice the group's timeout (the watchdog acts on a collective pending past the group's
  // timeout; this is the rank's own backstop). Negative: INVALID_ARGUMENT.
  absl::Duration timeout = absl::ZeroDuration();
  // NaN/Inf check of this rank's input (floating-point types): the group's setting
  // (GroupOptions::nan_check, else the daemon's config), off, on, or on every
  // nan_sample_period-th collective of the group (by its collective sequence number). The
  // group's policy decides what a finding on any rank does (GroupOptions::nan_policy).
  using NanCheck = ::commd::NanCheck;
  NanCheck nan_check = NanCheck::kDefault;
  uint32_t nan_sample_period = 100;  // for kSampled: kMinNanSamplePeriod to kMaxNanSamplePeriod
  // When set, receives the NaN/Inf count found in this rank's input (0 when not checked).
  uint64_t* nonfinite_count = nullptr;
  // When set, receives how many ranks found NaN/Inf in their input in this collective (the
  // same on every rank; ranks that did not check count as clean).
  int* nonfinite_ranks = nullptr;
  // A part of a larger collective recorded by hand (one flight-recorder entry for many
  // calls, e.g. a tensor staged through a buffer in chunks): the id Recorder::Begin returned
  // for it, begun and not yet completed or abandoned. The call then writes no entry of its
  // own; it still checks its arguments and the ranks' calls, runs the NaN/Inf check (sampled
  // by the part_of entry's sequence number, so every part of one collective alike; a finding
  // flags that entry) under the group's policy, keeps the heartbeat fresh and explains a
  // failed wait. The caller completes or abandons the entry (on any failure of a part, the
  // entry's collective failed). An id that is not a pending entry of this group's recorder:
  // INVALID_ARGUMENT naming it, nothing run. On CUDA buffers the parts are enqueued like any
  // call: record the entry stream-ordered around them on the parts' stream
  // (Recorder::Started / Completed with that cuda_stream), so its progress words follow the
  // device; a part's NaN/Inf count flags the entry when a later call finds the part done.
  std::optional<RecordId> part_of;
};

// One tensor of a coalesced collective: `count` elements at byte `offset` of the buffers.
struct CoalescedTensor {
  size_t offset = 0;  // into the input (and for all-reduce the in-place output) buffer
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
};

// One right-hand matrix of a fused matmul (Group::AllGatherMatmul, MatmulReduceScatter) and
// its output: this process's memory, row-major, in the call's type.
struct MatmulB {
  const void* data = nullptr;        // k x n
  size_t n = 0;                      // columns, 1 to 2^31 - 1
  void* out = nullptr;               // the call's output (its shape: see the call)
  const float* col_scale = nullptr;  // n scales: out[i][j] *= col_scale[j]; null: none
};

// PointToPoint::peer of a receive that takes the first message any rank sends it with its
// tag (PyTorch's recv without src, MPI's MPI_ANY_SOURCE); PointToPointRequest::source names
// the sender once it is done.
inline constexpr int kAnySource = -1;

// One send or receive of a point-to-point batch (Group::StartPointToPoint).
struct PointToPoint {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* data = nullptr;  // a send only reads it
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  int peer = -1;  // a rank of the group: [0, global_world_size()); a receive: or kAnySource
  int tag = 0;    // [0, kMaxPointToPointTag]
};

// Sends and receives in flight (Group::ISend, IRecv, StartPointToPoint). Their memory is in
// use until they are done; destroying the request waits for that.
class COMMD_API PointToPointRequest {
 public:
  struct State;  // internal to the SDK
  explicit PointToPointRequest(std::unique_ptr<State> state);
  ~PointToPointRequest();
  PointToPointRequest(const PointToPointRequest&) = delete;
  PointToPointRequest& operator=(const PointToPointRequest&) = delete;
  // Blocks (sleeping) until every one is done: the first failure in the batch's order, else
  // OK. Thread-safe; may be called again (it then returns the same).
  absl::Status Wait();
  // Whether every one is done, so that Wait would not block. Never blocks.
  bool Done() const;
  // The peer of op `i` of the batch (0 for ISend/IRecv): for a receive from kAnySource, the
  // rank whose message it took, once it has taken one (-1 before, and after a failure that
  // took none). -1 for `i` out of range. Never blocks.
  int source(size_t i = 0) const;

 private:
  std::unique_ptr<State> state_;
};

// One symmetric allocation: a buffer per rank, each laid out [signal pad | data], every rank
// mapping every other's. Unmapped on destruction (the daemon frees the memory once every rank
// released it).
class COMMD_API SymmetricBuffer {
 public:
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  void* data();                    // this rank's data
  void* peer(int rank);            // `rank`'s data, mapped here; nullptr for a rank out of range
  uint32_t* signal_pad(int rank);  // `rank`'s signal pad (uint32 slots)
  size_t signal_pad_bytes() const;
  size_t size() const;  // data bytes per rank, as asked
  Device device() const;
  uint64_t id() const;

 private:
  friend class Group;
  struct State;
  explicit SymmetricBuffer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

struct CollectiveCall;  // internal to the SDK: one collective call (Group::Run)

class COMMD_API Group {
 public:
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const;
  int world_size() const;
  int global_rank() const;
  // The group's size over every node: world_size() for a group on this node only.
  int global_world_size() const;
  // A group spanning nodes: every node with its ranks' global ranks, sorted by node name, the
  // same on every rank; node_index() is this node's place in it. Empty (and node_index() -1)
  // for a group on this node only. Collectives on a spanning host group run across the nodes
  // with the whole group's meaning (counts per global rank, wide buffers in global-rank
  // order, a global root; the host-memory overloads' staging buffer holds the input and the
  // output): docs/cluster.md, "Collectives across nodes". On a CUDA group spanning nodes,
  // all-reduce (also coalesced), broadcast and barrier run (node-local kernels, NCCL between
  // the nodes; each call first waits for every rank to make it); all-gather, reduce-scatter,
  // all-to-all and the fused matmuls fail UNIMPLEMENTED.
  const std::vector<NodeRanks>& layout() const;
  int node_index() const;
  const std::string& name() const;
  Device device() const;
  // pid of each rank's process, by rank.
  const std::vector<int64_t>& member_pids() const;

  // Collective: every rank must call it with the same `bytes`. Blocks until every rank has
  // asked (then each gets every rank's buffer), a rank asked another size (INVALID_ARGUMENT
  // on every rank), a rank left (ABORTED naming it) or the group's timeout passed
  // (DEADLINE_EXCEEDED naming the ranks that never asked).
  absl::StatusOr<std::unique_ptr<SymmetricBuffer>> AllocateSymmetric(size_t bytes);

  // Collectives over symmetric buffers of this group (host, or CUDA: see "On CUDA buffers"
  // below). Every rank calls them in the same order with the same arguments.
  // AllReduce works in place on `buf`'s first count elements; AllGather reads `in`'s first
  // count elements and writes world_size * count to `out` (rank-major); ReduceScatter reads
  // world_size * count from `in` and writes this rank's reduced chunk of count to `out`.
  // Broadcast copies root's first count elements of `buf` into every rank's `buf` (in place;
  // root in [0, world_size)); AllToAll (equal splits, MPI_Alltoall) reads world_size * count
  // from `in` and writes to `out` chunk p (count elements) = chunk `rank` of rank p's `in`.
  // INVALID_ARGUMENT (nothing touched) for a size beyond a buffer, a buffer of another
  // group, or `in` == `out`; INVALID_ARGUMENT on every rank, naming the ranks and their
  // calls, when ranks call with different counts, types, ops or collectives (the entry stays
  // incomplete, so the watchdog reports a mismatch; the buffers stay usable); DATA_LOSS on
  // every rank when the group's policy is kFail and a NaN/Inf check found one in some rank's
  // input; ABORTED once the group is aborted; DEADLINE_EXCEEDED after
  // CollectiveOptions::timeout (default twice the group's timeout). Waits sleep (futex) and
  // keep this rank's heartbeat fresh. Each records one flight-recorder entry (none of its own
  // as a part of one recorded by hand: CollectiveOptions::part_of).
  //
  // On CUDA buffers (a group on Device::Cuda; SDKs built with CUDA, else UNIMPLEMENTED) the
  // call enqueues kernels on CollectiveOptions::cuda_stream (null: the legacy default
  // stream; Barrier always uses it) and returns without waiting, as NCCL does; the
  // flight-recorder entry's started/completed progress is written in stream order, so the
  // watchdog sees the device's progress. Argument errors are INVALID_ARGUMENT with nothing
  // enqueued. What differs from host buffers:
  //  - Deferred errors: a device-side wait that fails (the group aborted, or a peer not
  //    arriving within CollectiveOptions::timeout) ends its kernels early and is reported by
  //    the group's next collective call: ABORTED or DEADLINE_EXCEEDED naming the peer, then
  //    on every later call too (the group's CUDA buffers are unusable after a failed wait;
  //    leave the group). The failed call's entry still reads as completed.
  //  - NaN/Inf: the check counts on the device; the count reaches this rank's control block
  //    (nan counters, the entry's NaN flag, hence the daemon's metrics) when a later call on
  //    the group finds that work complete. nonfinite_count / nonfinite_ranks, and a check
  //    under the group's NaN policy kFail, are INVALID_ARGUMENT (they need host buffers).
  //  - A part (CollectiveOptions::part_of) writes no stream-ordered progress of its own; its
  //    kernels belong to the entry recorded by hand, whose Started / Completed the caller
  //    enqueues on the same stream before and after the parts.
  //  - The check that ranks call with the same arguments is host-only: mismatched calls on
  //    CUDA buffers are not detected by the SDK (the watchdog still sees the entries).
  //  - World sizes up to 16. The kernels run in the group device's primary context (the
  //    CUDA runtime's), so cuda_stream must belong to it. Destroying the Group waits for its
  //    enqueued collectives; keep buffers alive until their stream has finished with them.
  absl::Status Barrier();
  absl::Status AllReduce(SymmetricBuffer& buf, size_t count, DataType dtype, ReduceOp op,
                         const CollectiveOptions& options = {});
  absl::Status AllGather(SymmetricBuffer& in, SymmetricBuffer& out, size_t count, DataType dtype,
                         const CollectiveOptions& options = {});
  absl::Status ReduceScatter(SymmetricBuffer& in, SymmetricBuffer& out, size_t count,
                             DataType dtype, ReduceOp op, const CollectiveOptions& options = {});
  absl::Status Broadcast(SymmetricBuffer& buf, size_t count, DataType dtype, int root,
                         const CollectiveOptions& options = {});
  absl::Status AllToAll(SymmetricBuffer& in, SymmetricBuffer& out, size_t count, DataType dtype,
                        const CollectiveOptions& options = {});
  // The same collectives on ordinary host memory (a host group only): `input` and `output`
  // are any of this process's memory, e.g. a framework's tensor; `staging` is a symmetric
  // buffer of this group that the call borrows as the area peers read. The call copies
  // `input` into this rank's part of `staging` once (the NaN check counts as it copies),
  // reads its peers' parts and writes the result straight to `output`: one pass in, one pass
  // out, no copy through the staging buffer on the way back. Sizes and results as for the
  // symmetric overloads (Broadcast is in place on `buffer`: the root's is read, every other
  // rank's written). `staging` must hold the call's input (count, or world_size * count for
  // ReduceScatter and AllToAll); after the call its contents are unspecified.
  //  - `input` and `output` may overlap or be the same memory (in-place AllReduce,
  //    AllGather's input inside its output, ...): the input is staged before any output is
  //    written. Neither may overlap any rank's part of `staging` (for data already in a
  //    symmetric buffer use the SymmetricBuffer overloads).
  //  - Pointers must be non-null (unless count is 0) and aligned to the element size.
  //  - Every rank passes its buffer of the same staging allocation.
  // Errors as for the symmetric overloads, with INVALID_ARGUMENT (nothing touched, no
  // flight-recorder entry) for a count whose input does not fit `staging` (naming the count,
  // the buffer and its capacity), a null or misaligned pointer, memory overlapping `staging`,
  // a `staging` of another group, and a group on a CUDA device (device memory takes the
  // SymmetricBuffer overloads). Each records one flight-recorder entry with the same shapes
  // as the symmetric overloads. Blocks until done; one call at a time per staging buffer.
  absl::Status AllReduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                         SymmetricBuffer& staging, const CollectiveOptions& options = {});
  absl::Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                         SymmetricBuffer& staging, const CollectiveOptions& options = {});
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                             ReduceOp op, SymmetricBuffer& staging,
                             const CollectiveOptions& options = {});
  absl::Status Broadcast(void* buffer, size_t count, DataType dtype, int root,
                         SymmetricBuffer& staging, const CollectiveOptions& options = {});
  absl::Status AllToAll(const void* input, void* output, size_t count, DataType dtype,
                        SymmetricBuffer& staging, const CollectiveOptions& options = {});
  // Point-to-point on host memory: `count` elements of `dtype` to or from rank `peer` of the
  // group (its rank over every node for a group spanning nodes; not this rank), matched by
  // (sender, receiver, tag). Messages of one sender, receiver and tag are received in the
  // order they were sent; different tags or peers are independent, so a ring of ISends
  // posted before their IRecvs (as PyTorch's pipelining schedules do) completes whatever the
  // sizes. The receiver gives the sender's count and dtype. How it runs (docs/architecture.md
  // "Point-to-point"): each (sender, receiver, tag) is a two-rank group of its own,
  // "<group>/p2p/<sender>-<receiver>/<tag>", formed by the first message (the daemon then
  // watches it as any group: a send whose receive never comes ends in that group's
  // rendezvous or collective timeout, the watchdog naming the rank missing), and a thread of this
  // rank that moves that channel's messages in order through a 1 MiB staging buffer; each message
  // is one broadcast entry in that group's flight recorder. Errors, with nothing started:
  // INVALID_ARGUMENT for a peer out of range or this rank, a tag out of range, a type that is not a
  // collective type, or a null pointer with a nonzero count; UNIMPLEMENTED on a CUDA group;
  // RESOURCE_EXHAUSTED past kMaxPointToPointChannels channels of this rank in the group. From the
  // wait: the channel's join or its broadcast's error (INVALID_ARGUMENT on both ranks, naming both
  // counts, when they differ), naming the peer and tag; ABORTED when this group is aborted
  // (messages in flight end, later ones fail at once); CANCELLED for messages still queued
  // when the Group is destroyed. Thread-safe: any thread may post or wait.
  // A receive from kAnySource takes the first message that any rank sends this rank with its
  // tag and that no receive naming the sender was posted for: it readies the channel from
  // every other rank with that tag (each counts against kMaxPointToPointChannels), looks for
  // a sender waiting in one of them, then receives from that one (its source() is the
  // sender). With none after the group's timeout: DEADLINE_EXCEEDED naming the tag.
  absl::Status Send(const void* data, size_t count, DataType dtype, int peer, int tag = 0);
  absl::Status Recv(void* data, size_t count, DataType dtype, int peer, int tag = 0);
  absl::StatusOr<std::unique_ptr<PointToPointRequest>> ISend(const void* data, size_t count,
                                                             DataType dtype, int peer, int tag = 0);
  absl::StatusOr<std::unique_ptr<PointToPointRequest>> IRecv(void* data, size_t count,
                                                             DataType dtype, int peer, int tag = 0);
  // Posts every one of `ops` (all checked first: one bad op posts none) and returns one
  // request for them all, as PyTorch's batch_isend_irecv.
  absl::StatusOr<std::unique_ptr<PointToPointRequest>> StartPointToPoint(
      std::span<const PointToPoint> ops);

  // Many tensors of `buf` reduced in place as one collective (one barrier pair, one entry).
  absl::Status AllReduceCoalesced(SymmetricBuffer& buf, const std::vector<CoalescedTensor>& tensors,
                                  ReduceOp op, const CollectiveOptions& options = {});

  // Fused compute and communication over symmetric memory (async tensor parallelism);
  // float32, float16 and bfloat16, accumulated in float32 (host groups: OpenBLAS's sgemm;
  // CUDA groups: cuBLAS, below).
  //
  // AllGatherMatmul: A's rows are sharded across the ranks; this rank's shard, `rows` x `k`
  // (leading dimensions flattened), is at the start of `a`. For every B (1 to 8 of them),
  // B.out = allgather(A) @ B.data, (world_size * rows) x B.n, shard p's rows at p * rows.
  // Each rank multiplies every shard where it lies in its owner's buffer: its own first,
  // before waiting for anyone, then its peers' in ring order (rank + 1, rank + 2, ...) as
  // soon as each has entered the call. Nothing is gathered unless `gathered` is given
  // ((world_size * rows) x k, filled as a side product). `row_scale` (this shard's `rows`
  // floats, or null) and each B's col_scale scale the output: out[i][j] = (A @ B)[i][j] *
  // row_scale[i] * col_scale[j], the row scales following A's (flattened) rows. With row
  // scales, `a` also holds them after the shard (at its byte size rounded up to 64).
  //
  // MatmulReduceScatter: A is this process's `rows` x `k` (rows a multiple of world_size);
  // b.out receives this rank's rows / world_size rows of the sum (kSum) or mean (kAvg) over
  // ranks of A @ B (scaled as above, row_scale having `rows` floats). Each rank multiplies
  // each destination's rows, its own last, and sgemm writes the fp32 partial product straight
  // into that destination's part of `workspace` (at least rows x n x 4 bytes per rank), which
  // the destination reduces in rank order.
  //
  // Errors as for the other collectives (INVALID_ARGUMENT naming the value and the allowed
  // range before anything is touched; the call check across ranks, which compares the shapes
  // and whether scales are used; NaN policy over A; ABORTED; DEADLINE_EXCEEDED naming the
  // ranks that never came). Each records one flight-recorder entry, an all_gather or a
  // reduce_scatter of A's [rows, k] into the output's [rows, n]. Host groups block until done.
  //
  // CUDA groups: the same protocol enqueued on options.cuda_stream with cuBLAS (cublasGemmEx,
  // fp32 accumulation), returning without waiting; every pointer argument is device memory of
  // the group's device. cuBLAS is loaded on the first call (FAILED_PRECONDITION naming the
  // library when it is missing, nothing enqueued). As for the other collectives on CUDA
  // buffers: no cross-rank call check, NaN policy FAIL with the check on refused, a failed
  // device-side wait reported by the group's next call (docs/fused-matmul.md).
  absl::Status AllGatherMatmul(SymmetricBuffer& a, size_t rows, size_t k, DataType dtype,
                               const std::vector<MatmulB>& bs, const float* row_scale = nullptr,
                               void* gathered = nullptr, const CollectiveOptions& options = {});
  absl::Status MatmulReduceScatter(const void* a, size_t rows, size_t k, DataType dtype,
                                   const MatmulB& b, ReduceOp op, SymmetricBuffer& workspace,
                                   const float* row_scale = nullptr,
                                   const CollectiveOptions& options = {});

  // Records collectives that run elsewhere (e.g. NCCL) into this rank's flight recorder.
  Recorder& recorder();

  // True once the daemon asked this group to stop (watchdog finding or commctl abort): the
  // group's collectives fail with ABORTED from then on. Never blocks; thread-safe.
  bool abort_requested() const;
  // Who aborted the group and why, in words that follow "group G aborted", e.g. "by the
  // watchdog (a collective is stuck: ...): all_reduce seq 42 ..." or "on request: uid 1000
  // (commctl, pid 4242) says: <its reason>"; empty while no abort was requested.
  std::string abort_reason() const;
  // Runs `callback` once, with ABORTED and the reason, when the daemon aborts this group: on
  // the SDK's event thread (keep it short; it must not call into this Group), or at once on
  // this thread when the abort came already. Replaces an earlier callback.
  void SetAbortCallback(std::function<void(const absl::Status&)> callback);
  // This rank's control block (shared with the daemon): progress, abort word, recorder.
  void* control_block() const;
  size_t control_block_bytes() const;

 private:
  friend class Client;
  struct State;
  explicit Group(std::unique_ptr<State> state);
  // The one path of every collective: checks, records and runs `call` (collectives.cc).
  absl::Status Run(const CollectiveCall& call);
  // AllocateSymmetric, in host memory when `host_memory` whatever the group's device (a
  // spanning CUDA group's agreement words).
  absl::StatusOr<std::unique_ptr<SymmetricBuffer>> AllocateSymmetricOn(size_t bytes,
                                                                       bool host_memory);
  absl::Duration collective_timeout() const;
  bool owns(const SymmetricBuffer& buffer) const;  // allocated by this group for this rank
  std::unique_ptr<State> state_;
  std::unique_ptr<SymmetricBuffer> barrier_buffer_;  // Barrier()'s signal pads
};

// A named buffer of the job that outlives its creator (see Client::AllocatePersistent).
class COMMD_API PersistentBuffer {
 public:
  ~PersistentBuffer();  // unmaps; the buffer itself lives on until its TTL passes unused
  PersistentBuffer(const PersistentBuffer&) = delete;
  PersistentBuffer& operator=(const PersistentBuffer&) = delete;
  void* data();
  size_t size() const;
  const std::string& name() const;

 private:
  friend class Client;
  struct State;
  explicit PersistentBuffer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_GROUP_H_
