// The collectives of a host group that spans nodes: see span_collectives.h.
#include "client/src/span_collectives.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/src/collective_call.h"
#include "common/random_token.h"
#include "common/status_macros.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/pair.h"
#include "kernels/host/collectives.h"
#include "kernels/host/element_loops.h"
#include "kernels/types.h"

namespace commd {
namespace {

using Bytes = std::byte;

// One rank's words in the span words buffer: the rank's signature and NaN/Inf count, written
// before the first barrier; the outcome (code, text; the leader's also the finding and whether
// lanes follow), written by the leader before the second barrier and by every rank after its
// lane. Every local rank reads every rank's.
struct SpanWords {
  uint64_t signature;
  uint64_t nonfinite;
  int32_t code;  // absl::StatusCode of the call on this node
  int32_t nonfinite_ranks;
  int32_t first_nonfinite_rank;  // a global rank; -1: none
  uint32_t text_bytes;
  uint64_t group_nonfinite;
  uint32_t lanes;  // the leader's: this call runs in lanes
  uint32_t pad;
  // With COMMD_SPAN_PROFILE: the leader's time in exchanges between nodes, each rank's in
  // its lane's (SpanProfile).
  int64_t lead_ns;
  int64_t lane_ns;
  char text[kSpanWordsBytes - 64];
};
static_assert(sizeof(SpanWords) == kSpanWordsBytes);

// What the leaders agree on before any data moves: the range of the call signatures over every
// rank of every node (a call that differs anywhere makes min != max) and the NaN/Inf finding.
struct Agreement {
  uint64_t signature_min;
  uint64_t signature_max;
  uint64_t group_nonfinite;
  int64_t nonfinite_ranks;
  int64_t first_nonfinite_rank;  // INT64_MAX: none
};

void Agree(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<Agreement*>(c);
  const auto* x = static_cast<const Agreement*>(a);
  const auto* y = static_cast<const Agreement*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = {std::min(x[i].signature_min, y[i].signature_min),
              std::max(x[i].signature_max, y[i].signature_max),
              x[i].group_nonfinite + y[i].group_nonfinite,
              x[i].nonfinite_ranks + y[i].nonfinite_ranks,
              std::min(x[i].first_nonfinite_rank, y[i].first_nonfinite_rank)};
  }
}

// A word-wise mix of the call's shape: what every rank of every node must agree on.
uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

uint64_t Signature(const CollectiveCall& c) {
  uint64_t h = Mix(1, static_cast<uint64_t>(c.kind));
  h = Mix(h, c.count);
  h = Mix(h, static_cast<uint64_t>(c.dtype));
  h = Mix(h, static_cast<uint64_t>(c.op));
  h = Mix(h, static_cast<uint64_t>(c.root + 1));
  // Where results go: a large all-reduce's lanes push into the peers' outputs unless staged.
  h = Mix(h, c.host_memory ? 2 : c.in == c.out ? 1 : 0);
  for (const CoalescedTensor& t : c.tensors) {
    h = Mix(Mix(Mix(h, t.count), static_cast<uint64_t>(t.dtype)), t.offset);
  }
  return h;
}

size_t ElementSize(DataType t) { return kernels::DataTypeSize(static_cast<kernels::DataType>(t)); }

// The job's store as gloo's rendezvous store: keys under `prefix`, failures thrown as gloo's.
// Waits go in slices, so that `stop` (the group aborted) ends them within one.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(commd::Store* store, std::string prefix, absl::Duration max_wait,
            std::function<bool()> stop)
      : store_(store), prefix_(std::move(prefix)), max_wait_(max_wait), stop_(std::move(stop)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const std::string k = prefix_ + key;
    Throw(store_->Set(k, std::string(data.begin(), data.end())), k);
    mine_.push_back(k);
  }
  // Gloo's stores block until the key exists.
  std::vector<char> get(const std::string& key) override {
    wait({key}, std::chrono::milliseconds(absl::ToInt64Milliseconds(max_wait_)));
    auto value = store_->Get(prefix_ + key);
    Throw(value.status(), prefix_ + key);
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    const absl::Time deadline = absl::Now() + std::min(absl::FromChrono(t), max_wait_);
    const std::string what = absl::StrCat(full.size(), " key(s) under ", prefix_);
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      const absl::Status s = store_->Wait(full, std::clamp(left, absl::Milliseconds(1), kSlice));
      if (s.ok() || !absl::IsDeadlineExceeded(s) || left <= kSlice) return Throw(s, what);
      if (stop_()) throw gloo::IoException(absl::StrCat("aborted while waiting for ", what));
    }
  }
  // Removes the keys this rank set (once every peer has read them).
  void DeleteMine() {
    for (const std::string& k : mine_) (void)store_->Delete(k);
    mine_.clear();
  }

 private:
  static constexpr absl::Duration kSlice = absl::Milliseconds(200);
  static void Throw(const absl::Status& s, const std::string& what) {
    if (!s.ok()) throw gloo::IoException(absl::StrCat("job store, ", what, ": ", s.ToString()));
  }
  commd::Store* store_;
  std::string prefix_;
  absl::Duration max_wait_;
  std::function<bool()> stop_;
  std::vector<std::string> mine_;
};

// The device gloo listens on and advertises: COMMD_GLOO_IFACE (an interface name), else
// COMMD_GLOO_HOSTNAME, else this host's name (docs/cluster.md).
gloo::transport::tcp::attr DeviceAttr() {
  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("COMMD_GLOO_IFACE"); iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else if (const char* host = std::getenv("COMMD_GLOO_HOSTNAME");
             host != nullptr && *host != '\0') {
    attr.hostname = host;
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    attr.hostname = name;
  }
  return attr;
}

// Fails every connection of `context`: a collective waiting on any of them (on this thread or
// another) throws at once, and the peers see the connection go and fail theirs. Gloo's
// Context::closeConnections would not do: it closes the sockets without waking a waiting
// collective. A tcp pair's signalExceptionExternal (what a timed-out wait calls) does, but it
// is protected: reached through a pointer to member named in a derived class.
struct PairAccess : gloo::transport::tcp::Pair {
  static void Fail(gloo::transport::tcp::Pair* pair, const std::string& why) {
    (pair->*(&PairAccess::signalExceptionExternal))(why);
  }
};

void Fail(gloo::Context& context, const std::string& group) {
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank) continue;
    std::unique_ptr<gloo::transport::Pair>& pair = context.getPair(peer);
    if (pair != nullptr) {
      PairAccess::Fail(static_cast<gloo::transport::tcp::Pair*>(pair.get()),
                       absl::StrCat("group ", group, " was aborted"));
    }
  }
}

// Where a spanning group's calls spend their time, when COMMD_SPAN_PROFILE is set on every
// rank of the node (a diagnostic, docs/cluster.md): per collective and size, the calls, their
// time in all, and the part of it between nodes: the leader's exchanges with the other nodes
// (which the other local ranks wait out at a barrier) and the slowest lane's, connecting
// included. The rest is the node-local phase. Printed to stderr when the group goes. Off:
// one branch per call.
class SpanProfile {
 public:
  static std::unique_ptr<SpanProfile> FromEnv(std::string group, int global_rank) {
    const char* on = std::getenv("COMMD_SPAN_PROFILE");
    if (on == nullptr || *on == '\0' || std::string_view(on) == "0") return nullptr;
    return std::make_unique<SpanProfile>(std::move(group), global_rank);
  }
  SpanProfile(std::string group, int global_rank)
      : group_(std::move(group)), global_rank_(global_rank) {}
  ~SpanProfile() {
    for (const auto& [key, t] : totals_) {
      const auto& [kind, bytes, staged] = key;
      std::fprintf(stderr,
                   "commd span profile: group %s global rank %d: %s %zu B %s: %llu calls, "
                   "%.1f us per call, %.1f us of it between nodes\n",
                   group_.c_str(), global_rank_,
                   std::string(RecordOpTorchName(static_cast<uint32_t>(kind))).c_str(), bytes,
                   staged ? "staged" : "in place", static_cast<unsigned long long>(t.calls),
                   static_cast<double>(t.total_ns) / 1e3 / static_cast<double>(t.calls),
                   static_cast<double>(t.across_ns) / 1e3 / static_cast<double>(t.calls));
    }
  }
  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void Call(const CollectiveCall& call, size_t bytes, int64_t since, int64_t across_ns) {
    Totals& t = totals_[{call.kind, bytes, call.host_memory}];
    ++t.calls;
    t.total_ns += Now() - since;
    t.across_ns += across_ns;
  }
  // Adds the time until it goes to `*ns` (nothing when null).
  class Timer {
   public:
    explicit Timer(int64_t* ns) : ns_(ns), start_(ns != nullptr ? Now() : 0) {}
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    ~Timer() {
      if (ns_ != nullptr) *ns_ += Now() - start_;
    }

   private:
    int64_t* ns_;
    int64_t start_;
  };

 private:
  struct Totals {
    uint64_t calls = 0;
    int64_t total_ns = 0, across_ns = 0;
  };
  const std::string group_;
  const int global_rank_;
  std::map<std::tuple<CollectiveOp, size_t, bool>, Totals> totals_;
};

class HostSpanBackend : public SpanBackend {
 public:
  explicit HostSpanBackend(SpanSetup s)
      : s_(std::move(s)),
        profile_(SpanProfile::FromEnv(s_.group, GlobalRank(s_.node_index, s_.local_rank))) {
    for (const NodeRanks& n : s_.layout) {
      uniform_ = uniform_ && n.global_ranks.size() == s_.layout[0].global_ranks.size();
      node_elems_.push_back(n.global_ranks.size());
      node_first_.push_back(node_ranks_total_);
      node_ranks_total_ += n.global_ranks.size();
    }
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    if (context_ != nullptr) Fail(*context_, s_.group);
  }

  // The agreement alone, through the group's words (their signal pads carry the node-local
  // barriers): every rank's signature, the leaders' gather, every rank reads the outcome.
  absl::Status Agree(const CheckedCall& c) override {
    if (!failed_.ok()) return failed_;
    kernels::HostCommView v = c.span_words->host;
    v.abort_word = s_.abort_word;
    v.heartbeat_ns = s_.heartbeat_ns;
    v.wait_limit = c.wait;
    SpanWords& mine = Words(c, v.rank);
    mine.signature = Signature(c.call);
    mine.nonfinite = 0;
    if (!leader()) mine.code = 0;  // as in Collective: the leader's is written between barriers
    RETURN_IF_ERROR(kernels::Barrier(v));
    if (leader()) {
      SpanWords& out = Words(c, 0);
      out.nonfinite_ranks = 0;
      out.first_nonfinite_rank = -1;
      out.group_nonfinite = 0;
      const absl::Status st = Guarded(c.call, [&]() -> absl::Status {
        RETURN_IF_ERROR(Connect());
        return GatherAgreement(c, v, out, /*inline_data=*/false);
      });
      mine.lanes = 0;
      Publish(mine, st);
    }
    RETURN_IF_ERROR(kernels::Barrier(v));
    return Outcome(Words(c, 0));
  }

  absl::Status Run(const CheckedCall& c, CollectiveEntry& entry) override {
    const CollectiveCall& call = c.call;
    if (call.matmul != nullptr) {
      return absl::UnimplementedError(
          absl::StrCat(RecordOpTorchName(static_cast<uint32_t>(call.kind)), " on group ", s_.group,
                       ": the fused matmuls run on groups within one node only (this one spans ",
                       s_.layout.size(), " nodes)"));
    }
    if (!failed_.ok()) return failed_;
    kernels::HostCommView view = c.views.host;
    view.abort_word = s_.abort_word;
    view.heartbeat_ns = s_.heartbeat_ns;
    view.wait_limit = c.wait;
    entry.BeginStarted();
    kernels::CollectiveResult result;
    const int64_t start = profile_ != nullptr ? SpanProfile::Now() : 0;
    gloo_ns_ = 0;
    absl::Status st = Collective(c, view, entry.nan(), &result);
    if (profile_ != nullptr) {
      // Read before this rank's next call: the words are rewritten only past its first barrier.
      int64_t across = Words(c, 0).lead_ns, lane = 0;
      if (Words(c, 0).lanes != 0) {
        for (int l = 0; l < view.world_size; ++l) lane = std::max(lane, Words(c, l).lane_ns);
      }
      profile_->Call(call, call.count * ElementSize(call.dtype), start, across + lane);
    }
    return entry.Finish(std::move(st), result);
  }

 private:
  bool leader() const { return s_.local_rank == 0; }
  // Where exchanges between nodes add their time (COMMD_SPAN_PROFILE), else null.
  int64_t* Profiled() { return profile_ != nullptr ? &gloo_ns_ : nullptr; }
  bool Aborted() {
    if (s_.abort_word != nullptr && __atomic_load_n(s_.abort_word, __ATOMIC_ACQUIRE) != 0) {
      return true;
    }
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  SpanWords& Words(const CheckedCall& c, int rank) const {
    return *reinterpret_cast<SpanWords*>(c.span_words->data[rank]);
  }
  // Where rank `l`'s output goes: its staging region (host-memory overloads), its region of the
  // call's buffer (in place), or of the output buffer.
  static Bytes* Dest(const CheckedCall& c, int l) {
    const CollectiveCall& call = c.call;
    if (call.host_memory || call.in == call.out) return c.views.data[l];
    return c.out_views->data[l];
  }

  absl::Status Collective(const CheckedCall& c, const kernels::HostCommView& v,
                          kernels::NanCheck nan, kernels::CollectiveResult* r) {
    const CollectiveCall& call = c.call;
    const size_t es = call.kind == CollectiveOp::kBarrier ? 1 : ElementSize(call.dtype);
    const auto g = static_cast<size_t>(s_.global_world_size);
    const bool wide_in =
        call.kind == CollectiveOp::kReduceScatter || call.kind == CollectiveOp::kAllToAll;
    const bool wide_out =
        call.kind == CollectiveOp::kAllGather || call.kind == CollectiveOp::kAllToAll;
    const size_t in_bytes = call.count * es * (wide_in ? g : 1);
    const size_t out_bytes = call.count * es * (wide_out ? g : 1);
    const bool empty = call.kind == CollectiveOp::kAllReduceCoalesced
                           ? std::all_of(call.tensors.begin(), call.tensors.end(),
                                         [](const CoalescedTensor& t) { return t.count == 0; })
                           : call.kind != CollectiveOp::kBarrier && call.count == 0;
    if (empty) return absl::OkStatus();  // a no-op on every rank, as on one node

    // Stage and count (the broadcast's input is the root's only).
    const bool holds_input =
        call.kind != CollectiveOp::kBroadcast || call.root == GlobalRank(s_.node_index, v.rank);
    Bytes* own = v.data[v.rank];
    uint64_t nonfinite = 0;
    const auto dtype = static_cast<kernels::DataType>(call.dtype);
    if (call.kind == CollectiveOp::kAllReduceCoalesced) {
      for (const CoalescedTensor& t : call.tensors) {
        nonfinite += kernels::CopyIn(static_cast<kernels::DataType>(t.dtype), own + t.offset,
                                     own + t.offset, t.count, nan);
      }
    } else if (call.kind != CollectiveOp::kBarrier && holds_input) {
      const auto* src = call.host_memory ? static_cast<const Bytes*>(call.input) : own;
      nonfinite = kernels::CopyIn(dtype, src, own, in_bytes / es, nan);
    }
    SpanWords& mine = Words(c, v.rank);
    mine.signature = Signature(call);
    mine.nonfinite = nonfinite;
    // The leader's code and lanes are its word for this call, written between the barriers
    // (a peer may still be reading the last call's); the others' own code says how their lane
    // went, and a rank whose lane failed runs no further call.
    if (!leader()) mine.code = 0;
    r->nonfinite_count = nonfinite;
    RETURN_IF_ERROR(kernels::Barrier(v));

    // Between the nodes. The leader first agrees on the call with the other nodes' leaders
    // (every path starts with that same exchange, so ranks that made different calls all stop
    // there), then exchanges the node's data; or, for a large all-reduce on nodes of equal
    // size, it says so and every rank then exchanges its lane. Every local rank follows the
    // leader's word, so the node's ranks pass the same barriers whatever they called.
    if (leader()) {
      const bool lanes = UsesLanes(call, v.world_size);
      const absl::Status st = Lead(c, v, in_bytes, out_bytes, es, lanes);
      mine.lanes = st.ok() && lanes;
      mine.lead_ns = gloo_ns_;
      gloo_ns_ = 0;
      Publish(mine, st);
    }
    RETURN_IF_ERROR(kernels::Barrier(v));
    const bool lanes = Words(c, 0).lanes != 0;
    if (lanes) {
      const absl::Status lane = Lane(c, v);
      mine.lane_ns = gloo_ns_;
      Publish(mine, lane);
      RETURN_IF_ERROR(kernels::Barrier(v));
    }

    // The outcome on this node: the first local rank's failure, and the leader's finding.
    const SpanWords& first = Words(c, 0);
    r->nonfinite_ranks = first.nonfinite_ranks;
    r->first_nonfinite_rank = first.first_nonfinite_rank;
    r->group_nonfinite_count = first.group_nonfinite;
    for (int l = 0; l < v.world_size; ++l) {
      if (Words(c, l).code == 0) continue;
      const absl::Status st = Outcome(Words(c, l));
      // After the lanes, a closing barrier as below: a peer may still read this region.
      if (lanes) RETURN_IF_ERROR(kernels::Barrier(v));
      return st;
    }
    if (lanes) {
      // Each lane pushed its slice into every symmetric output (Lane). A staged call's output
      // is the rank's own: every slice from the region where it was reduced, straight into
      // it; then nobody writes its region before every peer has read its slice.
      if (!call.host_memory) return absl::OkStatus();
      auto* target = static_cast<Bytes*>(call.output);
      for (int l = 0; l < v.world_size; ++l) {
        const auto [begin, n] = Slice(call.count, v.world_size, l);
        std::memcpy(target + begin * es, v.data[l] + begin * es, n * es);
      }
      return kernels::Barrier(v);
    }
    const bool root_here =
        call.kind == CollectiveOp::kBroadcast && call.root == GlobalRank(s_.node_index, v.rank);
    if (call.host_memory && call.kind != CollectiveOp::kBarrier && !root_here) {
      std::memcpy(call.output, own, out_bytes);
    }
    return absl::OkStatus();
  }

  // A large all-reduce on nodes of equal size runs in lanes: local rank l of every node reduces
  // the node's slice l and all-reduces it with the other nodes' rank l over its own gloo
  // connections, so every rank and connection works on 1/local of the data at once. Small
  // calls, other collectives and uneven nodes go through the leaders (one exchange).
  static constexpr size_t kLaneMinBytes = 4 << 20;
  bool UsesLanes(const CollectiveCall& call, int local) const {
    return call.kind == CollectiveOp::kAllReduce && uniform_ && local > 1 &&
           call.count * ElementSize(call.dtype) >= kLaneMinBytes;
  }
  // Lane l's elements of `count`: [begin, begin + n).
  static std::pair<size_t, size_t> Slice(size_t count, int local, int l) {
    const size_t chunk = (count + static_cast<size_t>(local) - 1) / static_cast<size_t>(local);
    const size_t begin = std::min(count, chunk * static_cast<size_t>(l));
    return {begin, std::min(count, begin + chunk) - begin};
  }

  // This rank's lane, once the leaders agreed (see UsesLanes): its slice reduced in place in
  // its own region and all-reduced with the other nodes' same lane.
  absl::Status Lane(const CheckedCall& c, const kernels::HostCommView& v) {
    const CollectiveCall& call = c.call;
    const auto dtype = static_cast<kernels::DataType>(call.dtype);
    const size_t es = ElementSize(call.dtype);
    const auto [begin, n] = Slice(call.count, v.world_size, v.rank);
    return Guarded(call, [&]() -> absl::Status {
      RETURN_IF_ERROR(Connect());
      if (n == 0) return absl::OkStatus();
      Bytes* slice = v.data[v.rank] + begin * es;
      Reduce(v.data, v.world_size, begin * es, n, dtype, slice, call.op);
      AcrossNodes(slice, n, dtype, call.op);
      // Into every local rank's symmetric output while the slice is in this core's cache:
      // only this rank reads or writes these bytes of the peers' regions in this call.
      if (!call.host_memory) {
        for (int l = 0; l < v.world_size; ++l) {
          Bytes* dst = Dest(c, l) + begin * es;
          if (dst != slice) std::memcpy(dst, slice, n * es);
        }
      }
      return absl::OkStatus();
    });
  }

  int GlobalRank(int node, int local) const {
    return s_.layout[static_cast<size_t>(node)].global_ranks[static_cast<size_t>(local)];
  }

  // What this node's ranks say about the call (every rank reads every local rank's words).
  Agreement NodeAgreement(const CheckedCall& c, const kernels::HostCommView& v) const {
    Agreement a{.signature_min = UINT64_MAX,
                .signature_max = 0,
                .group_nonfinite = 0,
                .nonfinite_ranks = 0,
                .first_nonfinite_rank = INT64_MAX};
    for (int l = 0; l < v.world_size; ++l) {
      const SpanWords& w = Words(c, l);
      a.signature_min = std::min(a.signature_min, w.signature);
      a.signature_max = std::max(a.signature_max, w.signature);
      if (w.nonfinite > 0) {
        a.group_nonfinite += std::min<uint64_t>(w.nonfinite, UINT32_MAX);
        ++a.nonfinite_ranks;
        a.first_nonfinite_rank =
            std::min<int64_t>(a.first_nonfinite_rank, GlobalRank(s_.node_index, l));
      }
    }
    return a;
  }

  // The group-wide agreement `a`: its NaN/Inf finding into `out`, and INVALID_ARGUMENT when
  // any rank of any node made another call.
  absl::Status Settle(const CollectiveCall& call, const Agreement& a, SpanWords& out) const {
    out.nonfinite_ranks = static_cast<int32_t>(a.nonfinite_ranks);
    out.first_nonfinite_rank =
        a.first_nonfinite_rank == INT64_MAX ? -1 : static_cast<int32_t>(a.first_nonfinite_rank);
    out.group_nonfinite = a.group_nonfinite;
    if (a.signature_min == a.signature_max) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        RecordOpTorchName(static_cast<uint32_t>(call.kind)), " on group ", s_.group,
        ": the ranks' calls differ (collective, count, type, op, root or tensors; signatures "
        "from ",
        absl::Hex(a.signature_min), " to ", absl::Hex(a.signature_max),
        "); every rank of every node must make the same call. Nothing was exchanged."));
  }

  // The leaders' first exchange of every collective but the barrier: each leader's node
  // agreement in a slot of a size that depends on the layout only (never on the call, so that
  // leaders that made different calls still make this same exchange), gathered from every
  // node. A small all-reduce (InlineAllReduce) rides in the slot: each leader reduces every
  // node's part in node order, so every node computes the same bits, and the call is done in
  // this one exchange. At most kGatherMaxBytes gathered.
  static constexpr size_t kGatherMaxBytes = 64 << 10;
  static constexpr size_t kSlotHeader = 64;  // the Agreement, padded
  static_assert(sizeof(Agreement) <= kSlotHeader);
  size_t InlineBytes() const {
    const size_t per_node =
        std::min<size_t>(kSlotHeader + 4096, kGatherMaxBytes / s_.layout.size());
    return per_node > kSlotHeader ? (per_node - kSlotHeader) / 64 * 64 : 0;
  }
  bool InlineAllReduce(const CollectiveCall& call) const {
    return call.kind == CollectiveOp::kAllReduce &&
           call.count * ElementSize(call.dtype) <= InlineBytes();
  }
  absl::Status GatherAgreement(const CheckedCall& c, const kernels::HostCommView& v, SpanWords& out,
                               bool inline_data = true) {
    const CollectiveCall& call = c.call;
    const bool with_data = inline_data && InlineAllReduce(call);
    const size_t slot = kSlotHeader + InlineBytes();
    const size_t nodes = s_.layout.size();
    std::vector<Bytes>& mine = Scratch(0, slot);
    std::vector<Bytes>& all = Scratch(1, slot * nodes);
    const Agreement here = NodeAgreement(c, v);
    std::memcpy(mine.data(), &here, sizeof(here));
    const auto dtype = static_cast<kernels::DataType>(call.dtype);
    if (with_data) {
      Reduce(v.data, v.world_size, 0, call.count, dtype, mine.data() + kSlotHeader, call.op);
    }
    gloo::AllgathervOptions opts(context_);
    opts.setInput(reinterpret_cast<uint8_t*>(mine.data()), slot);
    opts.setOutput(reinterpret_cast<uint8_t*>(all.data()), std::vector<size_t>(nodes, slot));
    {
      const SpanProfile::Timer timer(Profiled());
      gloo::allgatherv(opts);
    }
    Agreement a;
    std::memcpy(&a, all.data(), sizeof(a));
    absl::InlinedVector<const Bytes*, 16> parts = {all.data() + kSlotHeader};
    for (size_t k = 1; k < nodes; ++k) {
      Agreement b;
      std::memcpy(&b, all.data() + k * slot, sizeof(b));
      commd::Agree(&a, &a, &b, 1);
      parts.push_back(all.data() + k * slot + kSlotHeader);
    }
    RETURN_IF_ERROR(Settle(call, a, out));
    if (!with_data) return absl::OkStatus();
    Bytes* result = v.data[0];
    const kernels::ReduceOp op = call.op == ReduceOp::kAvg
                                     ? kernels::ReduceOp::kSum
                                     : static_cast<kernels::ReduceOp>(call.op);
    kernels::ReduceInto(dtype, op, parts.data(), static_cast<int>(nodes), 0, call.count, result, 1);
    if (call.op == ReduceOp::kAvg) {
      const Bytes* src = result;
      kernels::ReduceInto(dtype, kernels::ReduceOp::kAvg, &src, 1, 0, call.count, result,
                          s_.global_world_size);
    }
    const size_t bytes = call.count * ElementSize(call.dtype);
    for (int l = 1; l < v.world_size; ++l) std::memcpy(Dest(c, l), result, bytes);
    return absl::OkStatus();
  }

  // The status `w` carries. Anything but a refused call leaves the group failed for good:
  // an aborted group stays ABORTED, any other failure leaves it out of step.
  absl::Status Outcome(const SpanWords& w) {
    if (w.code == 0) return absl::OkStatus();
    const absl::Status st(static_cast<absl::StatusCode>(w.code),
                          std::string(w.text, std::min<size_t>(w.text_bytes, sizeof(w.text))));
    if (st.code() != absl::StatusCode::kInvalidArgument) {
      failed_ = absl::Status(
          st.code() == absl::StatusCode::kAborted ? st.code()
                                                  : absl::StatusCode::kFailedPrecondition,
          absl::StrCat("group ", s_.group,
                       " failed for good at an earlier collective: ", st.message()));
    }
    return st;
  }

  // Writes `st` to this rank's words for its node's ranks to read; a failure between the
  // nodes (anything but a refused call, or the group's abort itself, which the daemon already
  // has) asks the daemon to abort the group, since the exchanges are out of step from there on
  // (the daemon aborts it on every node).
  void Publish(SpanWords& mine, const absl::Status& st) {
    mine.code = static_cast<int32_t>(st.code());
    const std::string text(st.message().substr(0, sizeof(mine.text)));
    std::memcpy(mine.text, text.data(), text.size());
    mine.text_bytes = static_cast<uint32_t>(text.size());
    if (!st.ok() && st.code() != absl::StatusCode::kInvalidArgument &&
        st.code() != absl::StatusCode::kAborted && s_.request_abort) {
      s_.request_abort(absl::StrCat("the exchange between nodes failed on node ",
                                    s_.layout[s_.node_index].node, ": ", st.message()));
    }
  }

  // `exchange` with gloo's failures as UNAVAILABLE (ABORTED once the group was aborted).
  template <typename F>
  absl::Status Guarded(const CollectiveCall& call, F exchange) {
    try {
      return exchange();
    } catch (const std::exception& e) {
      // A peer that went away has usually been aborted: its node tells every node within a
      // few milliseconds (docs/cluster.md), and the abort's reason says more than a closed
      // connection. Wait for it a little.
      for (int i = 0; i < 100 && !Aborted(); ++i) absl::SleepFor(absl::Milliseconds(10));
      const std::string what =
          absl::StrCat(RecordOpTorchName(static_cast<uint32_t>(call.kind)), " on group ", s_.group,
                       ": the exchange between nodes (node ", s_.layout[s_.node_index].node, ", ",
                       s_.layout.size(), " nodes) failed: ", e.what());
      return Aborted() ? absl::AbortedError(what) : absl::UnavailableError(what);
    }
  }

  // The leader's part, between the barriers: the agreement, and unless the lanes take over
  // (`lanes`) the exchange, everything it says going to every local rank.
  absl::Status Lead(const CheckedCall& c, const kernels::HostCommView& v, size_t in_bytes,
                    size_t out_bytes, size_t es, bool lanes) {
    const CollectiveCall& call = c.call;
    SpanWords& out = Words(c, 0);
    out.nonfinite_ranks = 0;
    out.first_nonfinite_rank = -1;
    out.group_nonfinite = 0;
    return Guarded(call, [&]() -> absl::Status {
      RETURN_IF_ERROR(Connect());
      if (call.kind == CollectiveOp::kBarrier) {
        const SpanProfile::Timer timer(Profiled());
        gloo::BarrierOptions opts(context_);
        gloo::barrier(opts);
        return absl::OkStatus();
      }
      RETURN_IF_ERROR(GatherAgreement(c, v, out));
      if (lanes || InlineAllReduce(call)) return absl::OkStatus();
      return Exchange(c, v, in_bytes, out_bytes, es);
    });
  }

  // Gloo's full mesh between this rank's lane of every node (the leaders' for local rank 0),
  // made on the lane's first exchange.
  absl::Status Connect() {
    const SpanProfile::Timer timer(Profiled());
    {
      absl::MutexLock lock(&mu_);
      if (context_ != nullptr) return absl::OkStatus();
    }
    // Never a connect on an aborted group: gloo's connecting does not heed the abort, and
    // the abort's event may not have reached this process yet while its word is set.
    if (Aborted()) return absl::AbortedError(absl::StrCat("group ", s_.group, " was aborted"));
    auto device = gloo::transport::tcp::CreateDevice(DeviceAttr());
    const int nodes = static_cast<int>(s_.layout.size());
    auto context = std::make_shared<gloo::rendezvous::Context>(s_.node_index, nodes);
    context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(s_.connect_wait)));
    GlooStore store(
        s_.store, absl::StrCat("commd.span/", s_.group, "/", s_.formation, "/", s_.local_rank, "/"),
        s_.connect_wait, [this] { return Aborted(); });
    ASSIGN_OR_RETURN(const std::string proofs, Proofs(nodes));
    store.set(absl::StrCat("proof/", s_.node_index),
              std::vector<char>(proofs.begin(), proofs.end()));
    context->connectFullMesh(store, device);
    RETURN_IF_ERROR(Authenticate(context, store, proofs));
    {
      gloo::BarrierOptions opts(context);  // every peer has read every address and proof
      gloo::barrier(opts);
    }
    store.DeleteMine();
    absl::MutexLock lock(&mu_);
    context_ = std::move(context);
    if (closed_) Fail(*context_, s_.group);
    return absl::OkStatus();
  }

  // Gloo's TCP pairs take the first connection to their listening port as the peer, with
  // nothing to prove who it is: any process that can reach the port while the lane connects
  // (until the slowest node's first collective) could stand in for a node and feed the group
  // its data. So before any data, each rank sends every peer a token it drew for that peer
  // alone, over the new connection, and the peer compares it with the one the rank put in the
  // job's store, which only the job's own uid reads. A connection that cannot prove it ends
  // the group; a token seen by an impostor proves nothing to anyone else.
  static constexpr size_t kProofBytes = 32;  // RandomToken's: 128 bits in hex
  static absl::StatusOr<std::string> Proofs(int nodes) {
    std::string proofs;
    for (int k = 0; k < nodes; ++k) {
      ASSIGN_OR_RETURN(std::string token, RandomToken());
      if (token.size() != kProofBytes) {
        return absl::InternalError(absl::StrCat("a token of ", token.size(), " bytes"));
      }
      proofs += token;
    }
    return proofs;
  }
  absl::Status Authenticate(const std::shared_ptr<gloo::Context>& context, GlooStore& store,
                            const std::string& mine) {
    const size_t nodes = s_.layout.size();
    std::vector<char> got(nodes * kProofBytes);
    {
      gloo::AlltoallOptions opts(context);
      opts.setInput(const_cast<char*>(mine.data()), mine.size());
      opts.setOutput(got.data(), got.size());
      gloo::alltoall(opts);
    }
    for (size_t k = 0; k < nodes; ++k) {
      if (k == static_cast<size_t>(s_.node_index)) continue;
      const std::vector<char> theirs = store.get(absl::StrCat("proof/", k));
      const size_t at = static_cast<size_t>(s_.node_index) * kProofBytes;
      unsigned char differ = theirs.size() == nodes * kProofBytes ? 0 : 1;
      for (size_t b = 0; differ == 0 && b < kProofBytes; ++b) {
        differ |= static_cast<unsigned char>(theirs[at + b] ^ got[k * kProofBytes + b]);
      }
      if (differ != 0) {
        return absl::UnavailableError(absl::StrCat(
            "group ", s_.group, ": the connection from node ", s_.layout[k].node, " (lane ",
            s_.local_rank,
            ") did not prove it is that node's rank: another process "
            "may have connected to this rank's gloo port first. Nothing was exchanged"));
      }
    }
    return absl::OkStatus();
  }

  // The node's data with the other nodes', every local rank's result written to its output.
  absl::Status Exchange(const CheckedCall& c, const kernels::HostCommView& v, size_t in_bytes,
                        size_t out_bytes, size_t es) {
    const CollectiveCall& call = c.call;
    const int local = v.world_size;
    Bytes* const* regions = v.data;
    const auto dtype = static_cast<kernels::DataType>(call.dtype);
    switch (call.kind) {
      case CollectiveOp::kAllReduce:
        AllReduce(regions, local, 0, call.count, dtype, c);
        return absl::OkStatus();
      case CollectiveOp::kAllReduceCoalesced:
        for (const CoalescedTensor& t : call.tensors) {
          AllReduce(regions, local, t.offset, t.count, static_cast<kernels::DataType>(t.dtype), c);
        }
        return absl::OkStatus();
      case CollectiveOp::kBroadcast: {
        const auto [root_node, root_local] = Locate(call.root);
        if (root_node == s_.node_index && root_local != 0) {
          std::memcpy(regions[0], regions[root_local], in_bytes);
        }
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(reinterpret_cast<uint8_t*>(regions[0]), in_bytes);
        opts.setRoot(root_node);
        {
          const SpanProfile::Timer timer(Profiled());
          gloo::broadcast(opts);
        }
        for (int l = 1; l < local; ++l) std::memcpy(Dest(c, l), regions[0], in_bytes);
        return absl::OkStatus();
      }
      case CollectiveOp::kAllGather: {
        const size_t block = in_bytes;
        // This node's blocks in local order, then every node's in layout order.
        std::vector<Bytes>& mine = Scratch(0, block * static_cast<size_t>(local));
        for (int l = 0; l < local; ++l) std::memcpy(mine.data() + l * block, regions[l], block);
        std::vector<Bytes>& all = Scratch(1, block * node_ranks_total_);
        std::vector<size_t> counts;
        for (size_t n : node_elems_) counts.push_back(n * block);
        gloo::AllgathervOptions opts(context_);
        opts.setInput(reinterpret_cast<uint8_t*>(mine.data()), block * static_cast<size_t>(local));
        opts.setOutput(reinterpret_cast<uint8_t*>(all.data()), counts);
        {
          const SpanProfile::Timer timer(Profiled());
          gloo::allgatherv(opts);
        }
        for (int l = 0; l < local; ++l) {
          Bytes* dst = Dest(c, l);
          for (size_t node = 0; node < s_.layout.size(); ++node) {
            for (size_t p = 0; p < node_elems_[node]; ++p) {
              const auto gr = static_cast<size_t>(s_.layout[node].global_ranks[p]);
              std::memcpy(dst + gr * block, all.data() + (node_first_[node] + p) * block, block);
            }
          }
        }
        return absl::OkStatus();
      }
      case CollectiveOp::kReduceScatter: {
        const size_t elems = in_bytes / es, block = out_bytes;
        std::vector<Bytes>& sum = Scratch(0, in_bytes);
        Reduce(regions, local, 0, elems, dtype, sum.data(), c.call.op);
        AcrossNodes(sum.data(), elems, dtype, c.call.op);
        for (int l = 0; l < local; ++l) {
          const auto gr = static_cast<size_t>(GlobalRank(s_.node_index, l));
          std::memcpy(Dest(c, l), sum.data() + gr * block, block);
        }
        return absl::OkStatus();
      }
      case CollectiveOp::kAllToAll: {
        // To node k: for each of its ranks m, for each local rank l, l's block for m.
        const size_t block = in_bytes / static_cast<size_t>(s_.global_world_size);
        const auto l_here = static_cast<size_t>(local);
        std::vector<Bytes>& send = Scratch(0, in_bytes * l_here);
        std::vector<Bytes>& recv = Scratch(1, block * l_here * node_ranks_total_);
        std::vector<int64_t> send_counts, recv_counts;
        Bytes* p = send.data();
        for (size_t node = 0; node < s_.layout.size(); ++node) {
          for (int gr : s_.layout[node].global_ranks) {
            for (int l = 0; l < local; ++l) {
              std::memcpy(p, regions[l] + static_cast<size_t>(gr) * block, block);
              p += block;
            }
          }
          send_counts.push_back(static_cast<int64_t>(node_elems_[node] * l_here * block));
          recv_counts.push_back(static_cast<int64_t>(l_here * node_elems_[node] * block));
        }
        gloo::AlltoallvOptions opts(context_);
        opts.setInput(reinterpret_cast<uint8_t*>(send.data()), send_counts);
        opts.setOutput(reinterpret_cast<uint8_t*>(recv.data()), recv_counts);
        {
          const SpanProfile::Timer timer(Profiled());
          gloo::alltoallv(opts);
        }
        // From node k: for each local rank m, for each of k's ranks, its block for m.
        const Bytes* q = recv.data();
        for (size_t node = 0; node < s_.layout.size(); ++node) {
          for (int m = 0; m < local; ++m) {
            for (int gr : s_.layout[node].global_ranks) {
              std::memcpy(Dest(c, m) + static_cast<size_t>(gr) * block, q, block);
              q += block;
            }
          }
        }
        return absl::OkStatus();
      }
      default:
        return absl::UnimplementedError(
            absl::StrCat(RecordOpTorchName(static_cast<uint32_t>(call.kind)),
                         " has no implementation across nodes in this SDK"));
    }
  }

  // In place at `offset` of every region: the node's reduction into the leader's region, the
  // nodes' over gloo, then copied to every local rank's output.
  void AllReduce(Bytes* const* regions, int local, size_t offset, size_t count,
                 kernels::DataType dtype, const CheckedCall& c) {
    if (count == 0) return;
    const size_t bytes = count * kernels::DataTypeSize(dtype);
    Bytes* mine = regions[0] + offset;
    Reduce(regions, local, offset, count, dtype, mine, c.call.op);
    AcrossNodes(mine, count, dtype, c.call.op);
    for (int l = 1; l < local; ++l) std::memcpy(Dest(c, l) + offset, mine, bytes);
  }

  // dst = the node's ranks' elements at `offset` reduced in local-rank order (kAvg: summed;
  // AcrossNodes divides).
  static void Reduce(Bytes* const* regions, int local, size_t offset, size_t count,
                     kernels::DataType dtype, Bytes* dst, ReduceOp op) {
    const kernels::ReduceOp k =
        op == ReduceOp::kAvg ? kernels::ReduceOp::kSum : static_cast<kernels::ReduceOp>(op);
    absl::InlinedVector<const Bytes*, 16> srcs;
    for (int l = 0; l < local; ++l) srcs.push_back(regions[l] + offset);
    kernels::ReduceInto(dtype, k, srcs.data(), local, 0, count, dst, 1);
  }

  // The nodes' reduction of `count` elements at `data` (in place), divided for kAvg by the
  // global world size. Gloo splits the data at element boundaries of the type it is given, so
  // it is given an unsigned type of the element's size, and our reduction.
  void AcrossNodes(Bytes* data, size_t count, kernels::DataType dtype, ReduceOp op) {
    const kernels::ReduceOp k =
        op == ReduceOp::kAvg ? kernels::ReduceOp::kSum : static_cast<kernels::ReduceOp>(op);
    gloo::AllreduceOptions opts(context_);
    switch (kernels::DataTypeSize(dtype)) {
      case 2:
        opts.setOutput(reinterpret_cast<uint16_t*>(data), count);
        break;
      case 4:
        opts.setOutput(reinterpret_cast<uint32_t*>(data), count);
        break;
      default:
        opts.setOutput(reinterpret_cast<uint64_t*>(data), count);
        break;
    }
    opts.setReduceFunction([dtype, k](void* out, const void* a, const void* b, size_t n) {
      const Bytes* srcs[2] = {static_cast<const Bytes*>(a), static_cast<const Bytes*>(b)};
      kernels::ReduceInto(dtype, k, srcs, 2, 0, n, static_cast<Bytes*>(out), 1);
    });
    {
      const SpanProfile::Timer timer(Profiled());
      gloo::allreduce(opts);
    }
    if (op == ReduceOp::kAvg) {
      const Bytes* src = data;
      kernels::ReduceInto(dtype, kernels::ReduceOp::kAvg, &src, 1, 0, count, data,
                          s_.global_world_size);
    }
  }

  std::pair<int, int> Locate(int global_rank) const {
    for (size_t node = 0; node < s_.layout.size(); ++node) {
      const auto& ranks = s_.layout[node].global_ranks;
      for (size_t l = 0; l < ranks.size(); ++l) {
        if (ranks[l] == global_rank) return {static_cast<int>(node), static_cast<int>(l)};
      }
    }
    return {-1, -1};  // the funnel checked the root's range, and the layout covers every rank
  }

  // The leader's scratch `which`, at least `bytes` (kept: the next call of the size reuses it).
  std::vector<Bytes>& Scratch(int which, size_t bytes) {
    std::vector<Bytes>& s = scratch_[which];
    if (s.size() < bytes) s.resize(bytes);
    return s;
  }

  const SpanSetup s_;
  const std::unique_ptr<SpanProfile> profile_;  // null unless COMMD_SPAN_PROFILE
  int64_t gloo_ns_ = 0;  // the call's time in exchanges between nodes so far, when profiled
  std::vector<size_t> node_elems_;  // ranks per node, in layout order
  std::vector<size_t> node_first_;  // the first rank of each node in layout order
  size_t node_ranks_total_ = 0;
  bool uniform_ = true;  // every node has as many ranks
  absl::Status failed_;  // set once an exchange failed: every later call fails
  std::vector<Bytes> scratch_[2];
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Written once under mu_ (Connect), then read by the calling thread without it.
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace

std::unique_ptr<SpanBackend> MakeSpanBackend(SpanSetup setup) {
  return std::make_unique<HostSpanBackend>(std::move(setup));
}

}  // namespace commd
