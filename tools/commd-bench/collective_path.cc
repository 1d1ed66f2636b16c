#include "tools/commd-bench/collective_path.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/control_block.h"
#include "common/status_macros.h"
#include "kernels/algorithm.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"
#include "kernels/host/plan.h"

namespace commd::bench {
namespace {

size_t TypeSize(const Options& o) { return DataTypeSize(o.dtype); }

// Group's collectives, as an application calls them. The NaN check is off on both paths
// (the daemon's default), so a daemon configured otherwise does not skew the comparison.
class SdkPath : public CollectivePath {
 public:
  SdkPath(const Options& o, Group& group, const SymmetricBuffers& b) : o_(o), group_(group), b_(b) {
    call_.nan_check = CollectiveOptions::NanCheck::kOff;
  }

  absl::Status Step(const Size& s) override {
    const auto dtype = static_cast<DataType>(o_.dtype);
    const auto op = static_cast<ReduceOp>(o_.redop);
    switch (o_.op) {
      case CollectiveOp::kAllReduce:
        return group_.AllReduce(*b_.in, s.per_rank, dtype, op, call_);
      case CollectiveOp::kAllGather:
        return group_.AllGather(*b_.in, *b_.out, s.per_rank, dtype, call_);
      case CollectiveOp::kReduceScatter:
        return group_.ReduceScatter(*b_.in, *b_.out, s.per_rank, dtype, op, call_);
      case CollectiveOp::kBroadcast:
        return group_.Broadcast(*b_.in, s.per_rank, dtype, 0, call_);
      case CollectiveOp::kAllToAll:
        return group_.AllToAll(*b_.in, *b_.out, s.per_rank, dtype, call_);
      case CollectiveOp::kBarrier:
        return group_.Barrier();
      case CollectiveOp::kAllReduceCoalesced:
        // Built once per size, as a training loop keeps its bucket layout.
        if (tensors_for_ != s.per_rank) {
          tensors_ = CoalescedTensors(o_, s);
          tensors_for_ = s.per_rank;
        }
        return group_.AllReduceCoalesced(*b_.in, tensors_, op, call_);
      default:
        break;
    }
    return absl::InternalError("unknown op");
  }

 private:
  const Options& o_;
  Group& group_;
  SymmetricBuffers b_;
  CollectiveOptions call_;
  std::vector<CoalescedTensor> tensors_;
  size_t tensors_for_ = SIZE_MAX;
};

// The kernels over a view of `in` that the bench builds once: no per-call checks, no
// flight-recorder entry, no heartbeat; the abort word still stops it (`commctl abort`).
class KernelPath : public CollectivePath {
 public:
  KernelPath(const Options& o, Group& group, const SymmetricBuffers& b)
      : o_(o), b_(b), data_(o.ranks), pads_(o.ranks) {
    for (int p = 0; p < o.ranks; ++p) {
      data_[p] = static_cast<std::byte*>(b.in->peer(p));
      pads_[p] = b.in->signal_pad(p);
    }
    const uint32_t* abort_word = nullptr;
    if (group.control_block_bytes() >= kAbortOffset + sizeof(uint32_t)) {
      abort_word = reinterpret_cast<const uint32_t*>(
          static_cast<const std::byte*>(group.control_block()) + kAbortOffset);
    }
    view_ = kernels::HostCommView{.rank = group.rank(),
                                  .world_size = o.ranks,
                                  .data = data_.data(),
                                  .pads = pads_.data(),
                                  .data_bytes = b.in->size(),
                                  .pad_slots = b.in->signal_pad_bytes() / sizeof(uint32_t),
                                  .abort_word = abort_word};
  }

  void NewSize() override { view_.deadline = absl::Now() + absl::Minutes(2); }

  absl::Status Step(const Size& s) override {
    constexpr auto kOff = kernels::NanCheck::kOff;
    void* in = b_.in->data();
    switch (o_.op) {
      case CollectiveOp::kAllReduce:
        // Prepared once per size, as the SDK keeps it per buffer: the bare kernel's run,
        // without re-planning each call.
        if (prepared_for_ != s.per_rank) {
          const kernels::TensorArgs t{in, in, s.per_rank, o_.dtype};
          prepared_for_ = SIZE_MAX;
          RETURN_IF_ERROR(kernels::PrepareAllReduce(
              view_, absl::MakeConstSpan(&t, 1), o_.redop,
              AllReduceAlgorithm(o_, s.per_rank * TypeSize(o_), s.per_rank), &prepared_));
          prepared_for_ = s.per_rank;
        }
        return kernels::AllReducePrepared(view_, prepared_, kOff, nullptr);
      case CollectiveOp::kAllGather:
        return kernels::AllGather(view_, in, b_.out->data(), s.per_rank, o_.dtype, kOff, nullptr);
      case CollectiveOp::kReduceScatter:
        return kernels::ReduceScatter(view_, in, b_.out->data(), s.per_rank, o_.dtype, o_.redop,
                                      kOff, nullptr);
      case CollectiveOp::kBroadcast:
        return kernels::Broadcast(view_, in, s.per_rank, o_.dtype, 0, kOff, nullptr);
      case CollectiveOp::kAllToAll:
        return kernels::AllToAll(view_, in, b_.out->data(), s.per_rank, o_.dtype, kOff, nullptr);
      case CollectiveOp::kBarrier:
        return kernels::Barrier(view_);
      case CollectiveOp::kAllReduceCoalesced:
        if (args_for_ != s.per_rank) {
          args_.clear();
          for (const CoalescedTensor& t : CoalescedTensors(o_, s)) {
            std::byte* p = static_cast<std::byte*>(in) + t.offset;
            args_.push_back({p, p, t.count, o_.dtype});
          }
          args_for_ = s.per_rank;
        }
        return kernels::AllReduceCoalesced(
            view_, args_, o_.redop,
            AllReduceAlgorithm(o_, s.per_rank * TypeSize(o_), args_.front().count), kOff, nullptr);
      default:
        break;
    }
    return absl::InternalError("unknown op");
  }

 private:
  const Options& o_;
  SymmetricBuffers b_;
  std::vector<std::byte*> data_;
  std::vector<uint32_t*> pads_;
  kernels::HostCommView view_;
  std::vector<kernels::TensorArgs> args_;
  size_t args_for_ = SIZE_MAX;
  kernels::PreparedCollective prepared_;
  size_t prepared_for_ = SIZE_MAX;
};

}  // namespace

kernels::Algorithm AllReduceAlgorithm(const Options& o, size_t bytes, size_t min_count) {
  switch (o.algo) {
    case AlgoChoice::kOneShot:
      return kernels::Algorithm::kOneShot;
    case AlgoChoice::kTwoShot:
      return kernels::Algorithm::kTwoShot;
    case AlgoChoice::kAuto:
      break;
  }
  return kernels::ChooseAllReduceAlgorithm(
      bytes, min_count, o.ranks,
      {.one_shot_max_read_bytes = o.one_shot_max_read_bytes,
       .oversubscribed_one_shot_max_bytes = kernels::OversubscribedOneShotMaxBytes(o.ranks)});
}

std::vector<CoalescedTensor> CoalescedTensors(const Options& o, const Size& s) {
  const size_t each = s.per_rank / static_cast<size_t>(o.tensors);
  std::vector<CoalescedTensor> out;
  for (int t = 0; t < o.tensors; ++t) {
    out.push_back({.offset = static_cast<size_t>(t) * each * TypeSize(o),
                   .count = each,
                   .dtype = static_cast<DataType>(o.dtype)});
  }
  return out;
}

std::unique_ptr<CollectivePath> MakeCollectivePath(const Options& o, Path path, Group& group,
                                                   const SymmetricBuffers& buffers) {
  if (path == Path::kKernel) return std::make_unique<KernelPath>(o, group, buffers);
  return std::make_unique<SdkPath>(o, group, buffers);
}

}  // namespace commd::bench
