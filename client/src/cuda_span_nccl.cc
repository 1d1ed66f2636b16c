// A spanning CUDA group's NCCL lane: see cuda_span_nccl.h.
#include "client/src/cuda_span_nccl.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/float16.h"
#include "kernels/types.h"

namespace commd {
namespace {

using kernels::SpanNcclOp;
using kernels::SpanStep;
using kernels::SpanStepKind;

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUInt8:
    case DataType::kBool:  // its sum planned as a max (span_plan.cc)
      return ncclUint8;
    case DataType::kInt16:  // moved, never reduced (span_plan.cc refuses): the bits as fp16's
      return ncclFloat16;
    case DataType::kFloat32:
    default:  // not a collective type: the SDK's checks refused it before any plan
      return ncclFloat32;
  }
}

// 1 / n in `t` (a floating type: span_plan refuses kAvg of integers), for
// ncclRedOpCreatePreMulSum with ncclScalarHostImmediate (read before it returns).
struct Scalar {
  alignas(8) unsigned char bytes[8] = {};
};
Scalar InverseOf(int n, DataType t) {
  Scalar s;
  const float f = 1.0f / static_cast<float>(n);
  if (t == DataType::kFloat16) {
    const uint16_t bits = kernels::FloatToHalf(f).bits;
    std::memcpy(s.bytes, &bits, sizeof(bits));
  } else if (t == DataType::kBFloat16) {
    const uint16_t bits = kernels::FloatToBFloat16(f).bits;
    std::memcpy(s.bytes, &bits, sizeof(bits));
  } else if (t == DataType::kFloat64) {
    const double d = 1.0 / static_cast<double>(n);
    std::memcpy(s.bytes, &d, sizeof(d));
  } else {
    std::memcpy(s.bytes, &f, sizeof(f));
  }
  return s;
}

// The group's ranks in all, over every node of the layout.
int GlobalRanks(const SpanSetup& s) {
  int global = 0;
  for (const NodeRanks& n : s.layout) global += static_cast<int>(n.global_ranks.size());
  return global;
}

}  // namespace

SpanNcclLane::SpanNcclLane(const SpanAgreement& agreement)
    : agreement_(agreement), s_(agreement.setup()) {}

SpanNcclLane::~SpanNcclLane() {
  DeletePublished();
  absl::MutexLock lock(&mu_);
  AbortCommLocked();
}

bool SpanNcclLane::Stop() const {
  return closing_.load(std::memory_order_acquire) ||
         (s_.abort_word != nullptr && __atomic_load_n(s_.abort_word, __ATOMIC_ACQUIRE) != 0);
}

absl::Status SpanNcclLane::Poll() {
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
  // Not under mu_: the abort it asks for comes back through Close.
  agreement_.RequestAbort("a collective across nodes on CUDA memory", failed.message());
  return failed;
}

void SpanNcclLane::Close() {
  closing_.store(true, std::memory_order_release);
  // Waits for a call being polled to see `closing_` and let go (WaitNccl checks it between
  // polls): no NCCL call on the communicator runs while it is aborted.
  absl::MutexLock lock(&mu_);
  AbortCommLocked();
  if (failed_.ok()) failed_ = absl::AbortedError(absl::StrCat("group ", s_.group, " was aborted"));
}

// `st` fails the group for good (the communicator is of no further use). The call that
// failed reports it with its own code (DEADLINE_EXCEEDED when NCCL was still in progress at
// the deadline, naming the deadline); later calls EarlierLocked().
void SpanNcclLane::FailLocked(const absl::Status& st) {
  AbortCommLocked();
  if (!failed_.ok()) return;
  std::string why(st.message());
  if (absl::IsDeadlineExceeded(st)) {
    absl::StrAppend(
        &why, " (the deadline: the group's timeout, ", absl::FormatDuration(s_.connect_wait),
        ", from the start of this rank's NCCL step; the other nodes' rank ", s_.local_rank,
        " never took part, or the unique id the lane formed on is no live root's)");
  }
  failed_ = absl::Status(st.code(), absl::StrCat("group ", s_.group, " (lane ", s_.local_rank,
                                                 ", node ", agreement_.node_name(), "): ", why));
}

// What a call gets once the group failed for good: FAILED_PRECONDITION (the group is in no
// state to run it) carrying the first failure, or the abort itself.
absl::Status SpanNcclLane::EarlierLocked() const {
  if (absl::IsAborted(failed_)) return failed_;
  return absl::FailedPreconditionError(
      absl::StrCat("the group failed for good earlier: ", failed_.message()));
}

// Within a second: the abort is polled while it says it is in progress (nonblocking).
void SpanNcclLane::AbortCommLocked() {
  if (comm_ != nullptr) kernels::AbortNcclComm(*nccl_, comm_, absl::Now() + absl::Seconds(1));
  comm_ = nullptr;
}

// The lane's communicator, made on first use; a failure to make it fails the group.
absl::Status SpanNcclLane::CommLocked() {
  if (!failed_.ok()) return EarlierLocked();
  if (comm_ != nullptr) return absl::OkStatus();
  if (absl::Status made = ConnectLocked(); !made.ok()) {
    FailLocked(made);
    return failed_;
  }
  return absl::OkStatus();
}

// This rank's lane communicator, made once (see the header).
absl::Status SpanNcclLane::ConnectLocked() {
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
  RETURN_IF_ERROR(UniqueId(key, deadline, id));
  absl::StatusOr<ncclComm_t> comm = kernels::InitNcclComm(
      *nccl_, static_cast<int>(s_.layout.size()), s_.node_index, id, key, [this] { return Stop(); },
      deadline);
  // Deleted once every member is known to have read it: after the next agreement (a
  // communicator's join need not wait for every member, as NCCL's does, for this to hold).
  if (s_.node_index == 0) {
    absl::MutexLock published(&published_mu_);
    published_ = key;
  }
  if (!comm.ok()) return comm.status();
  comm_ = *comm;
  return absl::OkStatus();
}

// The lane's unique id: node 0's rank draws it and publishes it under `key`, the others read it.
absl::Status SpanNcclLane::UniqueId(const std::string& key, absl::Time deadline, ncclUniqueId& id) {
  if (s_.node_index == 0) {
    if (const ncclResult_t r = nccl_->get_unique_id(&id); r != ncclSuccess) {
      return kernels::NcclError(*nccl_, nullptr, r, "ncclGetUniqueId");
    }
    return s_.store->Set(key, std::string(id.internal, sizeof(id.internal)));
  }
  RETURN_IF_ERROR(WaitForKey(key, deadline));
  ASSIGN_OR_RETURN(const std::string value, s_.store->Get(key));
  if (value.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("store key ", key, " holds ", value.size(),
                                                   " bytes; an NCCL unique id is ",
                                                   sizeof(id.internal)));
  }
  std::memcpy(id.internal, value.data(), sizeof(id.internal));
  return absl::OkStatus();
}

void SpanNcclLane::DeletePublished() {
  std::string key;
  {
    absl::MutexLock lock(&published_mu_);
    key.swap(published_);
  }
  if (!key.empty()) (void)s_.store->Delete(key);
}

// Waits for `key` in slices, so that an abort ends the wait within one.
absl::Status SpanNcclLane::WaitForKey(const std::string& key, absl::Time deadline) const {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    const absl::Status st =
        s_.store->Wait({key}, std::clamp(left, absl::Milliseconds(1), absl::Milliseconds(200)));
    if (st.ok() || !absl::IsDeadlineExceeded(st)) return st;
    if (Stop()) return absl::AbortedError("the group was aborted");
    if (left <= absl::Milliseconds(200)) {
      return absl::DeadlineExceededError(absl::StrCat("node 0's rank ", s_.local_rank,
                                                      " never published its NCCL unique id (", key,
                                                      ") in time"));
    }
  }
}

absl::Status SpanNcclLane::Collective(const SpanStep& st, std::byte* region, void* scratch,
                                      cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CommLocked());
  const ncclDataType_t type = NcclType(st.dtype);
  void* from = st.from_scratch ? scratch : region + st.offset;
  void* to = st.to_scratch ? scratch : region + st.offset;
  if (st.kind == SpanStepKind::kNcclBroadcast) {
    return Finish(nccl_->broadcast(from, to, st.count, type, st.root, comm_, stream),
                  "ncclBroadcast");
  }
  ncclRedOp_t op = st.nccl_op == SpanNcclOp::kMin       ? ncclMin
                   : st.nccl_op == SpanNcclOp::kMax     ? ncclMax
                   : st.nccl_op == SpanNcclOp::kProduct ? ncclProd
                                                        : ncclSum;
  const bool premul = st.nccl_op == SpanNcclOp::kPreMulSumAvg;
  if (premul) {
    Scalar scalar = InverseOf(GlobalRanks(s_), st.dtype);
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

// Every call of the group is made, then ncclGroupEnd, which is polled to its end.
absl::Status SpanNcclLane::SendRecv(const SpanStep& st, std::span<std::byte* const> at,
                                    cudaStream_t stream) {
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
absl::Status SpanNcclLane::Finish(ncclResult_t first, const std::string& call) {
  const absl::Status st = kernels::WaitNccl(
      *nccl_, comm_, first, call, [this] { return Stop(); }, Deadline());
  if (!st.ok()) FailLocked(st);
  return st.ok() ? st : failed_;
}

}  // namespace commd
