// The host backend of Group's collectives: kernels/host over the buffers' cached views, run
// on this thread between the entry's transitions (the kernels run the cross-rank call check).
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "client/src/collective_call.h"
#include "common/control_block.h"
#include "common/status_macros.h"
#include "kernels/host/collectives.h"
#include "kernels/host/fused_matmul.h"

namespace commd {
namespace {

// Coalesced calls up to this many tensors build their kernel arguments on the stack.
constexpr size_t kInlineTensors = 16;

class HostBackend : public CollectiveBackend {
 public:
  HostBackend(const uint32_t* abort_word, uint64_t* heartbeat_ns)
      : abort_word_(abort_word), heartbeat_ns_(heartbeat_ns) {}

  absl::Status Run(const CheckedCall& c, CollectiveEntry& entry) override {
    kernels::HostCommView view = c.views.host;
    view.abort_word = abort_word_;
    view.heartbeat_ns = heartbeat_ns_;
    view.wait_limit = c.wait;
    // A collective that stages is recorded while its message is out, before its first wait,
    // so that recording adds nothing to the time between ranks (or, when it fails or returns
    // before sending, as it returns). The others (barrier, fused matmuls) wait first thing:
    // recorded before, so that a wait that hangs has its entry.
    if (Stages(c.call.kind)) {
      view.posted = [](void* e) { static_cast<CollectiveEntry*>(e)->BeginStarted(); };
      view.posted_context = &entry;
    } else {
      entry.BeginStarted();
    }
    kernels::CollectiveResult result;
    absl::Status status = Launch(view, c, entry.nan(), &result);
    if (!entry.begun()) entry.BeginStarted();
    return entry.Finish(std::move(status), result);
  }

 private:
  // The kernels that call HostCommView::posted (the ones that start with Stage).
  static bool Stages(CollectiveOp kind) {
    switch (kind) {
      case CollectiveOp::kAllReduce:
      case CollectiveOp::kAllReduceCoalesced:
      case CollectiveOp::kAllGather:
      case CollectiveOp::kReduceScatter:
      case CollectiveOp::kBroadcast:
      case CollectiveOp::kAllToAll:
        return true;
      default:
        return false;
    }
  }

  static absl::Status Launch(const kernels::HostCommView& v, const CheckedCall& c,
                             kernels::NanCheck nan, kernels::CollectiveResult* r) {
    const CollectiveCall& call = c.call;
    // The buffers' own data regions (all-reduce and broadcast: in place), or the host-memory
    // overloads' memory, which the kernels stage into the region and write results to.
    std::byte* region = v.data[v.rank];
    const void* in = call.host_memory ? call.input : region;
    void* out = call.host_memory ? call.output : c.out_views->host.data[v.rank];
    const auto dtype = call.dtype;
    const auto op = call.op;
    switch (call.kind) {
      case CollectiveOp::kBarrier:
        return kernels::Barrier(v);
      case CollectiveOp::kAllReduce: {
        if (c.prepared == nullptr) {
          return kernels::AllReduce(v, in, out, call.count, dtype, op, c.algorithm, nan, r);
        }
        // The buffer's key holds: its kernel call, prepared by the key's first run over the
        // buffer's views (the same arrays as `v`'s, which AllReducePrepared checks).
        PreparedCall& p = *c.prepared;
        if (!p.kernel_ready) {
          const kernels::TensorArgs t{in, out, call.count, dtype};
          RETURN_IF_ERROR(
              kernels::PrepareAllReduce(v, absl::MakeConstSpan(&t, 1), op, c.algorithm, &p.kernel));
          p.kernel_ready = true;
        }
        return kernels::AllReducePrepared(v, p.kernel, nan, r);
      }
      case CollectiveOp::kAllReduceCoalesced: {
        absl::InlinedVector<kernels::TensorArgs, kInlineTensors> args;
        args.reserve(call.tensors.size());
        for (const CoalescedTensor& t : call.tensors) {
          std::byte* p = region + t.offset;
          args.push_back({p, p, t.count, t.dtype});
        }
        return kernels::AllReduceCoalesced(v, args, op, c.algorithm, nan, r);
      }
      case CollectiveOp::kAllGather:
        return kernels::AllGather(v, in, out, call.count, dtype, nan, r);
      case CollectiveOp::kReduceScatter:
        return kernels::ReduceScatter(v, in, out, call.count, dtype, op, nan, r);
      case CollectiveOp::kBroadcast:
        return kernels::Broadcast(v, out, call.count, dtype, call.root, nan, r);
      case CollectiveOp::kAllToAll:
        return kernels::AllToAll(v, in, out, call.count, dtype, nan, r);
      case CollectiveOp::kAllGatherMatmul:
      case CollectiveOp::kMatmulReduceScatter:
        return LaunchMatmul(v, call, nan, r);
      default:
        return absl::UnimplementedError(
            absl::StrCat(CollectiveName(call.kind), " has no host kernel in this SDK"));
    }
  }

  static absl::Status LaunchMatmul(const kernels::HostCommView& v, const CollectiveCall& call,
                                   kernels::NanCheck nan, kernels::CollectiveResult* r) {
    const MatmulCall& m = *call.matmul;
    std::array<kernels::MatmulB, kernels::kMaxMatmulBs> bs;
    for (size_t i = 0; i < m.bs.size(); ++i) {
      bs[i] = {m.bs[i].data, m.bs[i].n, m.bs[i].out, m.bs[i].col_scale};
    }
    const auto dtype = call.dtype;
    if (call.kind == CollectiveOp::kAllGatherMatmul) {
      return kernels::AllGatherMatmul(v,
                                      {.rows = m.rows,
                                       .k = m.k,
                                       .dtype = dtype,
                                       .bs = absl::MakeConstSpan(bs.data(), m.bs.size()),
                                       .row_scale = m.row_scale,
                                       .gathered = m.gathered},
                                      nan, r);
    }
    return kernels::MatmulReduceScatter(v,
                                        {.a = m.a,
                                         .rows = m.rows,
                                         .k = m.k,
                                         .dtype = dtype,
                                         .op = call.op,
                                         .b = bs[0],
                                         .row_scale = m.row_scale},
                                        nan, r);
  }

  const uint32_t* abort_word_;
  uint64_t* heartbeat_ns_;
};

}  // namespace

std::unique_ptr<CollectiveBackend> MakeHostBackend(const uint32_t* abort_word,
                                                   uint64_t* heartbeat_ns) {
  return std::make_unique<HostBackend>(abort_word, heartbeat_ns);
}

}  // namespace commd
