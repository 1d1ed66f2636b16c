// The collectives of a host group that spans nodes: see span_collectives.h.
#include "client/src/span_collectives.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/src/span_exchange.h"
#include "client/src/span_profile.h"
#include "common/status_macros.h"
#include "gloo/barrier.h"
#include "kernels/host/collectives.h"
#include "kernels/host/element_loops.h"
#include "kernels/types.h"

namespace commd {
namespace {

using Bytes = std::byte;

// One rank's input and output of a call, in bytes, and its element's size.
struct Sizes {
  size_t es = 1;
  size_t in_bytes = 0;
  size_t out_bytes = 0;
};

Sizes SizesOf(const CollectiveCall& call, int global_world_size) {
  const size_t es = call.kind == CollectiveOp::kBarrier ? 1 : DataTypeSize(call.dtype);
  const auto g = static_cast<size_t>(global_world_size);
  const bool wide_in =
      call.kind == CollectiveOp::kReduceScatter || call.kind == CollectiveOp::kAllToAll;
  const bool wide_out =
      call.kind == CollectiveOp::kAllGather || call.kind == CollectiveOp::kAllToAll;
  return {.es = es,
          .in_bytes = call.count * es * (wide_in ? g : 1),
          .out_bytes = call.count * es * (wide_out ? g : 1)};
}

// A call with nothing to move: a no-op on every rank, as on one node.
bool Empty(const CollectiveCall& call) {
  if (call.kind == CollectiveOp::kAllReduceCoalesced) {
    return std::all_of(call.tensors.begin(), call.tensors.end(),
                       [](const CoalescedTensor& t) { return t.count == 0; });
  }
  return call.kind != CollectiveOp::kBarrier && call.count == 0;
}

// A large all-reduce on nodes of equal size runs in lanes: local rank l of every node reduces
// the node's slice l and all-reduces it with the other nodes' rank l over its own gloo
// connections, so every rank and connection works on 1/local of the data at once. Small
// calls, other collectives and uneven nodes go through the leaders (one exchange).
constexpr size_t kLaneMinBytes = 4 << 20;

// Lane l's elements of `count`: [begin, begin + n).
std::pair<size_t, size_t> Slice(size_t count, int local, int l) {
  const size_t chunk = (count + static_cast<size_t>(local) - 1) / static_cast<size_t>(local);
  const size_t begin = std::min(count, chunk * static_cast<size_t>(l));
  return {begin, std::min(count, begin + chunk) - begin};
}

bool Uniform(const SpanSetup& s) {
  for (const NodeRanks& n : s.layout) {
    if (n.global_ranks.size() != s.layout[0].global_ranks.size()) return false;
  }
  return true;
}

class HostSpanBackend : public CollectiveBackend {
 public:
  explicit HostSpanBackend(SpanSetup s)
      : profile_(
            SpanProfile::FromEnv(s.group, s.layout[static_cast<size_t>(s.node_index)]
                                              .global_ranks[static_cast<size_t>(s.local_rank)])),
        agreement_(std::move(s), /*timed=*/profile_ != nullptr),
        exchange_(agreement_),
        uniform_(Uniform(agreement_.setup())) {}

  void Close() { agreement_.Close(); }

  absl::Status Run(const CheckedCall& c, CollectiveEntry& entry) override {
    const CollectiveCall& call = c.call;
    const SpanSetup& s = agreement_.setup();
    if (call.matmul != nullptr) {
      return absl::UnimplementedError(
          absl::StrCat(CollectiveName(call.kind), " on group ", s.group,
                       ": the fused matmuls run on groups within one node only (this one spans ",
                       s.layout.size(), " nodes)"));
    }
    if (!agreement_.failed().ok()) return agreement_.failed();
    kernels::HostCommView view = c.views.host;
    view.abort_word = s.abort_word;
    view.heartbeat_ns = s.heartbeat_ns;
    view.wait_limit = c.wait;
    entry.BeginStarted();
    kernels::CollectiveResult result;
    const int64_t start = profile_ != nullptr ? SpanProfile::Now() : 0;
    agreement_.TakeTime();
    absl::Status st = Collective(c, view, entry.nan(), &result);
    if (profile_ != nullptr) {
      // Read before this rank's next call: the words are rewritten only past its first barrier.
      int64_t across = Words(c, 0).lead_ns, lane = 0;
      if (Words(c, 0).lanes != 0) {
        for (int l = 0; l < view.world_size; ++l) lane = std::max(lane, Words(c, l).lane_ns);
      }
      profile_->Call(call, call.count * DataTypeSize(call.dtype), start, across + lane);
    }
    return entry.Finish(std::move(st), result);
  }

 private:
  static SpanWords& Words(const CheckedCall& c, int rank) { return SpanAgreement::Words(c, rank); }

  absl::Status Collective(const CheckedCall& c, const kernels::HostCommView& v,
                          kernels::NanCheck nan, kernels::CollectiveResult* r) {
    const CollectiveCall& call = c.call;
    if (Empty(call)) return absl::OkStatus();
    const Sizes z = SizesOf(call, agreement_.setup().global_world_size);
    const uint64_t nonfinite = Stage(c, v, z, nan);
    SpanWords& mine = Words(c, v.rank);
    agreement_.Sign(call, nonfinite, mine);
    r->nonfinite_count = nonfinite;
    RETURN_IF_ERROR(kernels::Barrier(v));

    // Between the nodes. The leader first agrees on the call with the other nodes' leaders
    // (every path starts with that same exchange, so ranks that made different calls all stop
    // there), then exchanges the node's data; or, for a large all-reduce on nodes of equal
    // size, it says so and every rank then exchanges its lane. Every local rank follows the
    // leader's word, so the node's ranks pass the same barriers whatever they called.
    if (agreement_.leader()) {
      const bool lanes = UsesLanes(call, v.world_size);
      const absl::Status st = Lead(c, v, z, lanes);
      mine.lanes = st.ok() && lanes;
      mine.lead_ns = agreement_.TakeTime();
      agreement_.Publish(mine, st);
    }
    RETURN_IF_ERROR(kernels::Barrier(v));
    const bool lanes = Words(c, 0).lanes != 0;
    if (lanes) {
      const absl::Status lane = Lane(c, v);
      mine.lane_ns = agreement_.TakeTime();
      agreement_.Publish(mine, lane);
      RETURN_IF_ERROR(kernels::Barrier(v));
    }
    return Conclude(c, v, z, lanes, r);
  }

  // Stages this rank's input in its region and counts NaN/Inf on the way (the broadcast's
  // input is the root's only); the count.
  uint64_t Stage(const CheckedCall& c, const kernels::HostCommView& v, const Sizes& z,
                 kernels::NanCheck nan) const {
    const CollectiveCall& call = c.call;
    const bool holds_input =
        call.kind != CollectiveOp::kBroadcast ||
        call.root == agreement_.GlobalRank(agreement_.setup().node_index, v.rank);
    Bytes* own = v.data[v.rank];
    uint64_t nonfinite = 0;
    if (call.kind == CollectiveOp::kAllReduceCoalesced) {
      for (const CoalescedTensor& t : call.tensors) {
        nonfinite += kernels::CopyIn(t.dtype, own + t.offset, own + t.offset, t.count, nan);
      }
    } else if (call.kind != CollectiveOp::kBarrier && holds_input) {
      const auto* src = call.host_memory ? static_cast<const Bytes*>(call.input) : own;
      nonfinite = kernels::CopyIn(call.dtype, src, own, z.in_bytes / z.es, nan);
    }
    return nonfinite;
  }

  // The outcome on this node: the first local rank's failure, and the leader's finding; the
  // staged calls' results copied out.
  absl::Status Conclude(const CheckedCall& c, const kernels::HostCommView& v, const Sizes& z,
                        bool lanes, kernels::CollectiveResult* r) {
    const CollectiveCall& call = c.call;
    const SpanWords& first = Words(c, 0);
    r->nonfinite_ranks = first.nonfinite_ranks;
    r->first_nonfinite_rank = first.first_nonfinite_rank;
    r->group_nonfinite_count = first.group_nonfinite;
    for (int l = 0; l < v.world_size; ++l) {
      if (Words(c, l).code == 0) continue;
      const absl::Status st = agreement_.Outcome(Words(c, l));
      // After the lanes, a closing barrier as below: a peer may still read this region.
      if (lanes) RETURN_IF_ERROR(kernels::Barrier(v));
      return st;
    }
    if (lanes) {
      // Each lane pushed its slice into every symmetric output (SpanExchange::Lane). A staged
      // call's output is the rank's own: every slice from the region where it was reduced,
      // straight into it; then nobody writes its region before every peer has read its slice.
      if (!call.host_memory) return absl::OkStatus();
      auto* target = static_cast<Bytes*>(call.output);
      for (int l = 0; l < v.world_size; ++l) {
        const auto [begin, n] = Slice(call.count, v.world_size, l);
        std::memcpy(target + begin * z.es, v.data[l] + begin * z.es, n * z.es);
      }
      return kernels::Barrier(v);
    }
    const bool root_here =
        call.kind == CollectiveOp::kBroadcast &&
        call.root == agreement_.GlobalRank(agreement_.setup().node_index, v.rank);
    if (call.host_memory && call.kind != CollectiveOp::kBarrier && !root_here) {
      std::memcpy(call.output, v.data[v.rank], z.out_bytes);
    }
    return absl::OkStatus();
  }

  bool UsesLanes(const CollectiveCall& call, int local) const {
    return call.kind == CollectiveOp::kAllReduce && uniform_ && local > 1 &&
           call.count * DataTypeSize(call.dtype) >= kLaneMinBytes;
  }
  // A small all-reduce rides in the agreement's gather (SpanExchange::FillInline).
  bool InlineAllReduce(const CollectiveCall& call) const {
    return call.kind == CollectiveOp::kAllReduce &&
           call.count * DataTypeSize(call.dtype) <= agreement_.InlineBytes();
  }

  // The leader's part, between the barriers: the agreement, and unless the lanes take over
  // (`lanes`) the exchange, everything it says going to every local rank.
  absl::Status Lead(const CheckedCall& c, const kernels::HostCommView& v, const Sizes& z,
                    bool lanes) {
    const CollectiveCall& call = c.call;
    SpanWords& out = Words(c, 0);
    SpanAgreement::ClearFinding(out);
    return agreement_.Guarded(call.kind, [&]() -> absl::Status {
      RETURN_IF_ERROR(agreement_.Connect());
      if (call.kind == CollectiveOp::kBarrier) {
        const SpanProfile::Timer timer(agreement_.timer());
        gloo::BarrierOptions opts(agreement_.context());
        gloo::barrier(opts);
        return absl::OkStatus();
      }
      if (InlineAllReduce(call)) {
        SpanAgreement::Parts parts;
        RETURN_IF_ERROR(agreement_.Gather(
            c, v.world_size, out, [&](Bytes* slot) { SpanExchange::FillInline(c, v, slot); },
            parts));
        exchange_.FinishInline(c, v, parts);
        return absl::OkStatus();
      }
      RETURN_IF_ERROR(agreement_.Gather(c, v.world_size, out));
      if (lanes) return absl::OkStatus();
      return exchange_.Run(c, v, z.in_bytes, z.out_bytes, z.es);
    });
  }

  // This rank's lane, once the leaders agreed (see UsesLanes).
  absl::Status Lane(const CheckedCall& c, const kernels::HostCommView& v) {
    const auto [begin, n] = Slice(c.call.count, v.world_size, v.rank);
    return agreement_.Guarded(c.call.kind, [&]() -> absl::Status {
      RETURN_IF_ERROR(agreement_.Connect());
      if (n > 0) exchange_.Lane(c, v, begin, n);
      return absl::OkStatus();
    });
  }

  const std::unique_ptr<SpanProfile> profile_;  // null unless COMMD_SPAN_PROFILE
  SpanAgreement agreement_;
  SpanExchange exchange_;  // over agreement_'s mesh
  const bool uniform_;     // every node has as many ranks
};

}  // namespace

SpanCollectives MakeHostSpanCollectives(SpanSetup setup) {
  auto backend = std::make_unique<HostSpanBackend>(std::move(setup));
  HostSpanBackend* raw = backend.get();
  return {.backend = std::move(backend), .close = [raw] { raw->Close(); }};
}

}  // namespace commd
