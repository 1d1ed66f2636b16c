// The collectives of a group spanning nodes on CUDA memory: see cuda_span_collectives.h.
#include "client/src/cuda_span_collectives.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cuda_driver_api.h"
#include "common/status_macros.h"
#include "kernels/cuda/nccl_api.h"
#include "kernels/float16.h"
#include "kernels/types.h"

namespace commd {
namespace {

using kernels::SpanNcclOp;
using kernels::SpanStep;
using kernels::SpanStepKind;

ncclDataType_t NcclType(kernels::DataType t) {
  switch (t) {
    case kernels::DataType::kFloat16:
      return ncclFloat16;
    case kernels::DataType::kBFloat16:
      return ncclBfloat16;
    case kernels::DataType::kInt32:
      return ncclInt32;
    case kernels::DataType::kInt64:
      return ncclInt64;
    default:
      return ncclFloat32;
  }
}

// 1 / n in `t` (a floating type: span_plan refuses kAvg of integers), for
// ncclRedOpCreatePreMulSum with ncclScalarHostImmediate (read before it returns).
struct Scalar {
  alignas(8) unsigned char bytes[8] = {};
};
Scalar InverseOf(int n, kernels::DataType t) {
  Scalar s;
  const float f = 1.0f / static_cast<float>(n);
  if (t == kernels::DataType::kFloat16) {
    const uint16_t bits = kernels::FloatToHalf(f).bits;
    std::memcpy(s.bytes, &bits, sizeof(bits));
  } else if (t == kernels::DataType::kBFloat16) {
    const uint16_t bits = kernels::FloatToBFloat16(f).bits;
    std::memcpy(s.bytes, &bits, sizeof(bits));
  } else {
    std::memcpy(s.bytes, &f, sizeof(f));
  }
  return s;
}

bool IsNccl(SpanStepKind k) {
  return k == SpanStepKind::kNcclAllReduce || k == SpanStepKind::kNcclBroadcast ||
         k == SpanStepKind::kNcclSendRecv;
}

// The node-local kernels every local rank meets in (a copy or a count is this rank's alone).
bool IsMeeting(SpanStepKind k) {
  return !IsNccl(k) && k != SpanStepKind::kLocalCopy && k != SpanStepKind::kCountNonFinite;
}

// A call's buffers as the plan names them (kernels::SpanBuffer): this rank's and, through
// their mappings, its node's peers'.
struct Buffers {
  const kernels::CudaCommView* in = nullptr;
  const kernels::CudaCommView* out = nullptr;  // null for in-place collectives
  std::byte* scratch = nullptr;

  absl::StatusOr<const kernels::CudaCommView*> View(kernels::SpanBuffer which) const {
    const kernels::CudaCommView* v = which == kernels::SpanBuffer::kOut ? out : in;
    if (which == kernels::SpanBuffer::kScratch || v == nullptr) {
      return absl::InternalError(absl::StrCat("a step over buffer ", static_cast<int>(which),
                                              ", which this call has no view of"));
    }
    return v;
  }
  // `bytes` at byte `offset` of `which` of local rank `owner` (-1: this rank), checked against
  // the region (the plan derives every offset from the checked call; this guards the plan).
  absl::StatusOr<std::byte*> At(kernels::SpanBuffer which, int owner, size_t offset,
                                size_t bytes) const {
    if (which == kernels::SpanBuffer::kScratch) {
      if (owner >= 0 || scratch == nullptr) {
        return absl::InternalError("a step names another rank's scratch, or none was made");
      }
      return scratch + offset;
    }
    ASSIGN_OR_RETURN(const kernels::CudaCommView* v, View(which));
    const int rank = owner < 0 ? v->rank : owner;
    if (rank >= v->world_size || offset > v->data_bytes || bytes > v->data_bytes - offset) {
      return absl::InternalError(absl::StrCat(
          "a step's ", bytes, " bytes at ", offset, " of local rank ", rank,
          "'s region pass its end (", v->data_bytes, " bytes) or its rank is not on this node"));
    }
    return v->data[rank] + offset;
  }
};

class CudaSpanPartImpl : public CudaSpanPart {
 public:
  explicit CudaSpanPartImpl(SpanSetup s) : s_(std::move(s)) {
    for (const NodeRanks& n : s_.layout) {
      shape_.node_sizes.push_back(static_cast<int>(n.global_ranks.size()));
      shape_.global_ranks.emplace_back(n.global_ranks.begin(), n.global_ranks.end());
    }
    shape_.node = s_.node_index;
    shape_.local_rank = s_.local_rank;
    agreement_ = MakeSpanBackend(s_);
  }

  // The group's enqueued work has finished (the CUDA backend's state waits for it first), so
  // aborting frees the communicator without waiting on peers that may be gone (as PyTorch's
  // ProcessGroupNCCL does; ncclCommDestroy could wait for them forever).
  ~CudaSpanPartImpl() override {
    DeletePublished();
    absl::MutexLock lock(&mu_);
    AbortCommLocked();
  }

  absl::Status Agree(const CheckedCall& c) override {
    RETURN_IF_ERROR(PollNccl());
    RETURN_IF_ERROR(agreement_->Agree(c));
    // Every rank has entered this call, so every member of a communicator made by the last
    // one has read its unique id: the key can go (see ConnectLocked).
    DeletePublished();
    return absl::OkStatus();
  }

  absl::StatusOr<kernels::SpanPlan> Plan(const CheckedCall& c) override {
    const CollectiveCall& call = c.call;
    absl::StatusOr<kernels::SpanPlan> plan;
    const auto dtype = static_cast<kernels::DataType>(call.dtype);
    const auto op = static_cast<kernels::ReduceOp>(call.op);
    switch (call.kind) {
      case CollectiveOp::kAllReduce:
        plan = kernels::PlanSpanAllReduce(shape_, 0, call.count, dtype, op,
                                          kernels::kSpanLaneMinBytes);
        break;
      case CollectiveOp::kAllReduceCoalesced: {
        kernels::SpanPlan all;
        for (const CoalescedTensor& t : call.tensors) {
          plan = kernels::PlanSpanAllReduce(shape_, t.offset, t.count,
                                            static_cast<kernels::DataType>(t.dtype), op,
                                            kernels::kSpanLaneMinBytes);
          if (!plan.ok()) break;
          kernels::AppendSpanPlan(all, *plan);
        }
        if (plan.ok() || call.tensors.empty()) plan = std::move(all);
        break;
      }
      case CollectiveOp::kBroadcast: {
        const auto [node, local] = Locate(call.root);
        plan = kernels::PlanSpanBroadcast(shape_, call.count, dtype, node, local);
        break;
      }
      case CollectiveOp::kBarrier:
        plan = kernels::PlanSpanBarrier(shape_);
        break;
      case CollectiveOp::kAllGather:
        plan = kernels::PlanSpanAllGather(shape_, call.count, dtype);
        break;
      case CollectiveOp::kReduceScatter:
        plan = kernels::PlanSpanReduceScatter(shape_, call.count, dtype, op,
                                              kernels::kSpanLaneMinBytes);
        break;
      case CollectiveOp::kAllToAll:
        plan = kernels::PlanSpanAllToAll(shape_, call.count, dtype);
        break;
      default:
        plan = absl::UnimplementedError(Unsupported(call));
    }
    if (call.matmul != nullptr) plan = absl::UnimplementedError(Unsupported(call));
    if (plan.ok()) return plan;
    return absl::Status(plan.status().code(),
                        absl::StrCat(RecordOpTorchName(static_cast<uint32_t>(call.kind)),
                                     " on group ", s_.group, ": ", plan.status().message()));
  }

  absl::Status Launch(const kernels::SpanPlan& plan, const kernels::CudaCommView& v,
                      const kernels::CudaCommView* out, kernels::NanCheck nan,
                      const kernels::AllReduceThresholds& thresholds, void* scratch,
                      cudaStream_t stream, int* enqueued) override {
    const Buffers b{.in = &v, .out = out, .scratch = static_cast<std::byte*>(scratch)};
    std::byte* region = v.data[v.rank];
    for (const SpanStep& st : plan.steps) {
      // A node of one rank has nothing to meet within (its buffer already is the node's).
      if (IsMeeting(st.kind) && v.world_size == 1) continue;
      const kernels::NanCheck step_nan = st.reads_input ? nan : kernels::NanCheck::kOff;
      void* at = region + st.offset;
      switch (st.kind) {
        case SpanStepKind::kLocalBarrier:
          RETURN_IF_ERROR(kernels::LaunchBarrier(v, stream));
          break;
        case SpanStepKind::kLocalAllReduce: {
          const size_t bytes = st.count * kernels::DataTypeSize(st.dtype);
          const kernels::Algorithm a =
              kernels::ChooseAllReduceAlgorithm(bytes, st.count, v.world_size, thresholds);
          RETURN_IF_ERROR(kernels::LaunchAllReduce(v, at, at, st.count, st.dtype, st.local_op, a,
                                                   step_nan, scratch, stream));
          break;
        }
        case SpanStepKind::kLocalReduceScatter:
          RETURN_IF_ERROR(kernels::LaunchReduceScatter(v, at, scratch, st.count, st.dtype,
                                                       st.local_op, step_nan, stream));
          break;
        case SpanStepKind::kLocalAllGather:
          RETURN_IF_ERROR(
              kernels::LaunchAllGather(v, at, scratch, st.count, st.dtype, step_nan, stream));
          break;
        case SpanStepKind::kLocalBroadcast: {
          ASSIGN_OR_RETURN(const kernels::CudaCommView* view, b.View(st.buffer));
          RETURN_IF_ERROR(kernels::LaunchBroadcast(*view, view->data[view->rank] + st.offset,
                                                   st.count, st.dtype, st.root, step_nan, stream));
          break;
        }
        case SpanStepKind::kLocalCopy:
          RETURN_IF_ERROR(Copy(st, b, stream));
          break;
        case SpanStepKind::kCountNonFinite: {
          if (step_nan != kernels::NanCheck::kOn) continue;  // this call is not checked
          const size_t bytes = st.count * kernels::DataTypeSize(st.dtype);
          ASSIGN_OR_RETURN(std::byte * in, b.At(kernels::SpanBuffer::kIn, -1, st.offset, bytes));
          RETURN_IF_ERROR(kernels::LaunchCountNonFinite(v, in, st.count, st.dtype, stream));
          break;
        }
        case SpanStepKind::kNcclAllReduce:
        case SpanStepKind::kNcclBroadcast:
          RETURN_IF_ERROR(NcclStep(st, region, scratch, stream));
          break;
        case SpanStepKind::kNcclSendRecv:
          RETURN_IF_ERROR(NcclSendRecv(st, b, stream));
          break;
      }
      ++*enqueued;
    }
    return absl::OkStatus();
  }

  void Close() override {
    closing_.store(true, std::memory_order_release);
    agreement_->Close();
    // Waits for a call being polled to see `closing_` and let go (WaitNccl checks it between
    // polls): no NCCL call on the communicator runs while it is aborted.
    absl::MutexLock lock(&mu_);
    AbortCommLocked();
    if (failed_.ok())
      failed_ = absl::AbortedError(absl::StrCat("group ", s_.group, " was aborted"));
  }

  void Failed(const absl::Status& why) override {
    if (!s_.request_abort) return;  // it cuts the reason to what the daemon takes
    s_.request_abort(absl::StrCat("a collective across nodes on CUDA memory failed on node ",
                                  s_.layout[static_cast<size_t>(s_.node_index)].node, ": ",
                                  why.message()));
  }

 private:
  bool Stop() const {
    return closing_.load(std::memory_order_acquire) ||
           (s_.abort_word != nullptr && __atomic_load_n(s_.abort_word, __ATOMIC_ACQUIRE) != 0);
  }

  std::string Unsupported(const CollectiveCall& call) const {
    if (call.matmul != nullptr) {
      return absl::StrCat("the fused matmuls run on groups within one node only (this one spans ",
                          s_.layout.size(),
                          " nodes: their GEMM is fused into the node-local kernels' passes over "
                          "peer memory, which NCCL's steps between the nodes cannot join)");
    }
    return absl::StrCat(
        "across nodes on CUDA memory this SDK runs all-reduce (also coalesced), broadcast, "
        "barrier, all-gather, reduce-scatter and all-to-all (this group spans ",
        s_.layout.size(), " nodes)");
  }

  std::pair<int, int> Locate(int global_rank) const {
    for (size_t node = 0; node < s_.layout.size(); ++node) {
      const auto& ranks = s_.layout[node].global_ranks;
      for (size_t l = 0; l < ranks.size(); ++l) {
        if (ranks[l] == global_rank) return {static_cast<int>(node), static_cast<int>(l)};
      }
    }
    return {-1, -1};  // the plan refuses it (the funnel checked the root's range already)
  }

  // An asynchronous NCCL error (a peer or the network gone) fails the group for good here and
  // asks the daemon to abort it everywhere.
  absl::Status PollNccl() {
    absl::Status failed;
    {
      absl::MutexLock lock(&mu_);
      if (!failed_.ok()) return EarlierLocked();
      if (comm_ == nullptr) return absl::OkStatus();
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = nccl_->comm_get_async_error(comm_, &state);
      if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) {
        return absl::OkStatus();
      }
      FailLocked(kernels::NcclError(*nccl_, comm_, r != ncclSuccess ? r : state,
                                    "an earlier NCCL call between the nodes"));
      failed = failed_;
    }
    Failed(failed);  // not under mu_: the abort it asks for comes back through Close
    return failed;
  }

  // `st` fails the group for good (the communicator is of no further use). The call that
  // failed reports it with its own code (DEADLINE_EXCEEDED when NCCL was still in progress at
  // the deadline, naming the deadline); later calls EarlierLocked().
  void FailLocked(const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AbortCommLocked();
    if (failed_.ok()) {
      std::string why(st.message());
      if (absl::IsDeadlineExceeded(st)) {
        absl::StrAppend(
            &why, " (the deadline: the group's timeout, ", absl::FormatDuration(s_.connect_wait),
            ", from the start of this rank's NCCL step; the other nodes' rank ", s_.local_rank,
            " never took part, or the unique id the lane formed on is no live "
            "root's)");
      }
      failed_ = absl::Status(
          st.code(), absl::StrCat("group ", s_.group, " (lane ", s_.local_rank, ", node ",
                                  s_.layout[static_cast<size_t>(s_.node_index)].node, "): ", why));
    }
  }

  // What a call gets once the group failed for good: FAILED_PRECONDITION (the group is in no
  // state to run it) carrying the first failure, or the abort itself.
  absl::Status EarlierLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::IsAborted(failed_)) return failed_;
    return absl::FailedPreconditionError(
        absl::StrCat("the group failed for good earlier: ", failed_.message()));
  }

  // Within a second: the abort is polled while it says it is in progress (nonblocking).
  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (comm_ != nullptr) kernels::AbortNcclComm(*nccl_, comm_, absl::Now() + absl::Seconds(1));
    comm_ = nullptr;
  }

  absl::Time Deadline() const { return absl::Now() + s_.connect_wait; }

  // The lane's communicator, made on first use; a failure to make it fails the group.
  absl::Status CommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_.ok()) return EarlierLocked();
    if (comm_ != nullptr) return absl::OkStatus();
    if (absl::Status made = ConnectLocked(); !made.ok()) {
      FailLocked(made);
      return failed_;
    }
    return absl::OkStatus();
  }

  // This rank's lane communicator, made once (see the header).
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_.ok()) return EarlierLocked();
    if (Stop()) return absl::AbortedError("the group was aborted");
    if (nccl_ == nullptr) {
      absl::StatusOr<const kernels::NcclApi*> api = kernels::Nccl();
      if (!api.ok()) return api.status();
      nccl_ = *api;
    }
    const std::string key =
        absl::StrCat("commd.span/", s_.group, "/", s_.formation, "/nccl/", s_.local_rank);
    const absl::Time deadline = Deadline();
    ncclUniqueId id{};
    const bool publisher = s_.node_index == 0;
    if (publisher) {
      if (const ncclResult_t r = nccl_->get_unique_id(&id); r != ncclSuccess) {
        return kernels::NcclError(*nccl_, nullptr, r, "ncclGetUniqueId");
      }
      RETURN_IF_ERROR(s_.store->Set(key, std::string(id.internal, sizeof(id.internal))));
    } else {
      RETURN_IF_ERROR(WaitForKey(key, deadline));
      ASSIGN_OR_RETURN(const std::string value, s_.store->Get(key));
      if (value.size() != sizeof(id.internal)) {
        return absl::InvalidArgumentError(absl::StrCat("store key ", key, " holds ", value.size(),
                                                       " bytes; an NCCL unique id is ",
                                                       sizeof(id.internal)));
      }
      std::memcpy(id.internal, value.data(), sizeof(id.internal));
    }
    absl::StatusOr<ncclComm_t> comm = kernels::InitNcclComm(
        *nccl_, static_cast<int>(s_.layout.size()), s_.node_index, id, key,
        [this] { return Stop(); }, deadline);
    // Deleted once every member is known to have read it: after the next agreement (a
    // communicator's join need not wait for every member, as NCCL's does, for this to hold).
    if (publisher) {
      absl::MutexLock published(&published_mu_);
      published_ = key;
    }
    if (!comm.ok()) return comm.status();
    comm_ = *comm;
    return absl::OkStatus();
  }

  void DeletePublished() {
    std::string key;
    {
      absl::MutexLock lock(&published_mu_);
      key.swap(published_);
    }
    if (!key.empty()) (void)s_.store->Delete(key);
  }

  // Waits for `key` in slices, so that an abort ends the wait within one.
  absl::Status WaitForKey(const std::string& key, absl::Time deadline) const {
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      const absl::Status st =
          s_.store->Wait({key}, std::clamp(left, absl::Milliseconds(1), absl::Milliseconds(200)));
      if (st.ok() || !absl::IsDeadlineExceeded(st)) return st;
      if (Stop()) return absl::AbortedError("the group was aborted");
      if (left <= absl::Milliseconds(200)) {
        return absl::DeadlineExceededError(absl::StrCat("node 0's rank ", s_.local_rank,
                                                        " never published its NCCL unique id (",
                                                        key, ") in time"));
      }
    }
  }

  // One NCCL step, its communicator made first if need be; a failure fails the group.
  absl::Status NcclStep(const SpanStep& st, std::byte* region, void* scratch, cudaStream_t stream) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CommLocked());
    const ncclDataType_t type = NcclType(st.dtype);
    void* from = st.from_scratch ? scratch : region + st.offset;
    void* to = st.to_scratch ? scratch : region + st.offset;
    if (st.kind == SpanStepKind::kNcclBroadcast) {
      return Finish(nccl_->broadcast(from, to, st.count, type, st.root, comm_, stream),
                    "ncclBroadcast");
    }
    ncclRedOp_t op = st.nccl_op == SpanNcclOp::kMin   ? ncclMin
                     : st.nccl_op == SpanNcclOp::kMax ? ncclMax
                                                      : ncclSum;
    const bool premul = st.nccl_op == SpanNcclOp::kPreMulSumAvg;
    if (premul) {
      int global = 0;
      for (int n : shape_.node_sizes) global += n;
      Scalar scalar = InverseOf(global, st.dtype);
      RETURN_IF_ERROR(Finish(
          nccl_->red_op_create_pre_mul_sum(&op, scalar.bytes, type, ncclScalarHostImmediate, comm_),
          "ncclRedOpCreatePreMulSum"));
    }
    absl::Status done =
        Finish(nccl_->all_reduce(from, to, st.count, type, op, comm_, stream), "ncclAllReduce");
    // May go once the call that takes it has returned (nccl.h); the communicator may be gone.
    if (premul && comm_ != nullptr) (void)nccl_->red_op_destroy(op, comm_);
    return done;
  }

  // A stream-ordered device copy (the driver's, so a peer's region is reached through its
  // mapping here).
  static absl::Status Copy(const SpanStep& st, const Buffers& b, cudaStream_t stream) {
    const size_t bytes = st.count * kernels::DataTypeSize(st.dtype);
    ASSIGN_OR_RETURN(std::byte * from, b.At(st.buffer, st.src_owner, st.offset, bytes));
    ASSIGN_OR_RETURN(std::byte * to, b.At(st.dst, st.dst_owner, st.dst_offset, bytes));
    ASSIGN_OR_RETURN(const CudaDriverApi* cu, CudaDriver());
    if (const CUresult r = cu->memcpy_dtod_async(reinterpret_cast<CUdeviceptr>(to),
                                                 reinterpret_cast<CUdeviceptr>(from), bytes,
                                                 reinterpret_cast<CUstream>(stream));
        r != CUDA_SUCCESS) {
      const char* name = nullptr;
      cu->get_error_name(r, &name);
      return absl::InternalError(absl::StrCat("cuMemcpyDtoDAsync of ", bytes,
                                              " bytes: ", name != nullptr ? name : "error ",
                                              name != nullptr ? "" : absl::StrCat(r)));
    }
    return absl::OkStatus();
  }

  // One group of sends and receives on this rank's lane (see SpanStepKind::kNcclSendRecv):
  // every call of the group is made, then ncclGroupEnd, which is polled to its end.
  absl::Status NcclSendRecv(const SpanStep& st, const Buffers& b, cudaStream_t stream) {
    const size_t es = kernels::DataTypeSize(st.dtype);
    std::vector<std::byte*> at;
    for (const kernels::SpanTransfer& x : st.transfers) {
      ASSIGN_OR_RETURN(std::byte * p, b.At(x.buffer, x.owner, x.offset, x.count * es));
      at.push_back(p);
    }
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CommLocked());
    const ncclDataType_t type = NcclType(st.dtype);
    if (const ncclResult_t r = nccl_->group_start(); r != ncclSuccess) {
      return Finish(r, "ncclGroupStart");
    }
    ncclResult_t first = ncclSuccess;
    std::string failed_call;
    for (size_t i = 0; i < st.transfers.size() && first == ncclSuccess; ++i) {
      const kernels::SpanTransfer& x = st.transfers[i];
      first = x.send ? nccl_->send(at[i], x.count, type, x.peer, comm_, stream)
                     : nccl_->recv(at[i], x.count, type, x.peer, comm_, stream);
      if (first != ncclSuccess) failed_call = x.send ? "ncclSend" : "ncclRecv";
    }
    // Ended even after a failed call, as NCCL asks, so no group stays open on this thread.
    const ncclResult_t end = nccl_->group_end();
    if (first != ncclSuccess) return Finish(first, failed_call);
    return Finish(end, "ncclGroupEnd");
  }

  // Polls the call that returned `first` to its end (nonblocking communicator).
  absl::Status Finish(ncclResult_t first, const std::string& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Status st = kernels::WaitNccl(
        *nccl_, comm_, first, call, [this] { return Stop(); }, Deadline());
    if (!st.ok()) FailLocked(st);
    return st.ok() ? st : failed_;
  }

  const SpanSetup s_;
  kernels::SpanShape shape_;
  std::unique_ptr<SpanBackend> agreement_;  // the host path's, for its Agree and Close
  std::atomic<bool> closing_{false};
  absl::Mutex mu_;
  const kernels::NcclApi* nccl_ ABSL_GUARDED_BY(mu_) = nullptr;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // sticky: the lane's communicator is unusable
  absl::Mutex published_mu_;
  std::string published_ ABSL_GUARDED_BY(published_mu_);  // this rank's unique id key, if any
};

}  // namespace

std::unique_ptr<CudaSpanPart> MakeCudaSpanPart(SpanSetup setup) {
  return std::make_unique<CudaSpanPartImpl>(std::move(setup));
}

size_t SpanScratchBytes(const kernels::SpanPlan& plan, int local,
                        const kernels::AllReduceThresholds& thresholds) {
  size_t bytes = plan.scratch_bytes;
  if (local == 1) return bytes;  // no node-local step runs
  for (const SpanStep& st : plan.steps) {
    if (st.kind != SpanStepKind::kLocalAllReduce) continue;
    const size_t b = st.count * kernels::DataTypeSize(st.dtype);
    if (kernels::ChooseAllReduceAlgorithm(b, st.count, local, thresholds) ==
        kernels::Algorithm::kOneShot) {
      bytes = std::max(bytes, b);
    }
  }
  return bytes;
}

}  // namespace commd
