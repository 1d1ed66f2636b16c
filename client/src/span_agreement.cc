// The agreement between the nodes of a spanning group: see span_agreement.h.
#include "client/src/span_agreement.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/src/span_profile.h"
#include "common/random_token.h"
#include "common/status_macros.h"
#include "gloo/allgatherv.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/pair.h"
#include "kernels/host/collectives.h"

namespace commd {
namespace {

// What the leaders agree on before any data moves: the range of the call signatures over every
// rank of every node (a call that differs anywhere makes min != max) and the NaN/Inf finding.
struct Agreement {
  uint64_t signature_min;
  uint64_t signature_max;
  uint64_t group_nonfinite;
  int64_t nonfinite_ranks;
  int64_t first_nonfinite_rank;  // INT64_MAX: none
};

// `a` and `b` agreed into `a`.
void Combine(Agreement& a, const Agreement& b) {
  a = {std::min(a.signature_min, b.signature_min), std::max(a.signature_max, b.signature_max),
       a.group_nonfinite + b.group_nonfinite, a.nonfinite_ranks + b.nonfinite_ranks,
       std::min(a.first_nonfinite_rank, b.first_nonfinite_rank)};
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

// Gloo's TCP pairs take the first connection to their listening port as the peer, with
// nothing to prove who it is: any process that can reach the port while the lane connects
// (until the slowest node's first collective) could stand in for a node and feed the group
// its data. So before any data, each rank sends every peer a token it drew for that peer
// alone, over the new connection, and the peer compares it with the one the rank put in the
// job's store, which only the job's own uid reads. A connection that cannot prove it ends
// the group; a token seen by an impostor proves nothing to anyone else.
constexpr size_t kProofBytes = 32;  // RandomToken's: 128 bits in hex

absl::StatusOr<std::string> Proofs(int nodes) {
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

absl::Status Authenticate(const SpanSetup& s, const std::shared_ptr<gloo::Context>& context,
                          GlooStore& store, const std::string& mine) {
  const size_t nodes = s.layout.size();
  std::vector<char> got(nodes * kProofBytes);
  {
    gloo::AlltoallOptions opts(context);
    opts.setInput(const_cast<char*>(mine.data()), mine.size());
    opts.setOutput(got.data(), got.size());
    gloo::alltoall(opts);
  }
  for (size_t k = 0; k < nodes; ++k) {
    if (k == static_cast<size_t>(s.node_index)) continue;
    const std::vector<char> theirs = store.get(absl::StrCat("proof/", k));
    const size_t at = static_cast<size_t>(s.node_index) * kProofBytes;
    unsigned char differ = theirs.size() == nodes * kProofBytes ? 0 : 1;
    for (size_t b = 0; differ == 0 && b < kProofBytes; ++b) {
      differ |= static_cast<unsigned char>(theirs[at + b] ^ got[k * kProofBytes + b]);
    }
    if (differ != 0) {
      return absl::UnavailableError(
          absl::StrCat("group ", s.group, ": the connection from node ", s.layout[k].node,
                       " (lane ", s.local_rank,
                       ") did not prove it is that node's rank: another process "
                       "may have connected to this rank's gloo port first. Nothing was exchanged"));
    }
  }
  return absl::OkStatus();
}

// The group-wide agreement `a`: its NaN/Inf finding into `out`, and INVALID_ARGUMENT when
// any rank of any node made another call.
absl::Status Settle(const std::string& group, const CollectiveCall& call, const Agreement& a,
                    SpanWords& out) {
  out.nonfinite_ranks = static_cast<int32_t>(a.nonfinite_ranks);
  out.first_nonfinite_rank =
      a.first_nonfinite_rank == INT64_MAX ? -1 : static_cast<int32_t>(a.first_nonfinite_rank);
  out.group_nonfinite = a.group_nonfinite;
  if (a.signature_min == a.signature_max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      CollectiveName(call.kind), " on group ", group,
      ": the ranks' calls differ (collective, count, type, op, root or tensors; signatures "
      "from ",
      absl::Hex(a.signature_min), " to ", absl::Hex(a.signature_max),
      "); every rank of every node must make the same call. Nothing was exchanged."));
}

// The leaders' gather: each node's agreement in a slot of a size that depends on the layout
// only (never on the call, so that leaders that made different calls still make this same
// exchange). At most kGatherMaxBytes gathered.
constexpr size_t kGatherMaxBytes = 64 << 10;
constexpr size_t kSlotHeader = 64;  // the Agreement, padded
static_assert(sizeof(Agreement) <= kSlotHeader);

}  // namespace

SpanAgreement::SpanAgreement(SpanSetup setup, bool timed) : s_(std::move(setup)), timed_(timed) {}

SpanAgreement::~SpanAgreement() = default;

std::pair<int, int> SpanAgreement::Locate(int global_rank) const {
  for (size_t node = 0; node < s_.layout.size(); ++node) {
    const auto& ranks = s_.layout[node].global_ranks;
    for (size_t l = 0; l < ranks.size(); ++l) {
      if (ranks[l] == global_rank) return {static_cast<int>(node), static_cast<int>(l)};
    }
  }
  return {-1, -1};  // the funnel checked the root's range, and the layout covers every rank
}

// Through the group's words (their signal pads carry the node-local barriers): every rank's
// signature, the leaders' gather, every rank reads the outcome.
absl::Status SpanAgreement::Agree(const CheckedCall& c) {
  if (!failed_.ok()) return failed_;
  kernels::HostCommView v = c.span_words->host;
  v.abort_word = s_.abort_word;
  v.heartbeat_ns = s_.heartbeat_ns;
  v.wait_limit = c.wait;
  SpanWords& mine = Words(c, v.rank);
  Sign(c.call, 0, mine);
  RETURN_IF_ERROR(kernels::Barrier(v));
  if (leader()) {
    SpanWords& out = Words(c, 0);
    ClearFinding(out);
    const absl::Status st = Guarded(c.call.kind, [&]() -> absl::Status {
      RETURN_IF_ERROR(Connect());
      return Gather(c, v.world_size, out);
    });
    mine.lanes = 0;
    Publish(mine, st);
  }
  RETURN_IF_ERROR(kernels::Barrier(v));
  return Outcome(Words(c, 0));
}

void SpanAgreement::Sign(const CollectiveCall& call, uint64_t nonfinite, SpanWords& mine) const {
  mine.signature = Signature(call);
  mine.nonfinite = nonfinite;
  // The leader's code and lanes are its word for this call, written between the barriers
  // (a peer may still be reading the last call's); the others' own code says how their lane
  // went, and a rank whose lane failed runs no further call.
  if (!leader()) mine.code = 0;
}

void SpanAgreement::ClearFinding(SpanWords& out) {
  out.nonfinite_ranks = 0;
  out.first_nonfinite_rank = -1;
  out.group_nonfinite = 0;
}

size_t SpanAgreement::InlineBytes() const {
  const size_t per_node = std::min<size_t>(kSlotHeader + 4096, kGatherMaxBytes / s_.layout.size());
  return per_node > kSlotHeader ? (per_node - kSlotHeader) / 64 * 64 : 0;
}

absl::Status SpanAgreement::Gather(const CheckedCall& c, int local, SpanWords& out) {
  return GatherSlots(c, local, out, nullptr, nullptr);
}

absl::Status SpanAgreement::Gather(const CheckedCall& c, int local, SpanWords& out,
                                   absl::FunctionRef<void(std::byte*)> fill, Parts& parts) {
  return GatherSlots(c, local, out, &fill, &parts);
}

absl::Status SpanAgreement::GatherSlots(const CheckedCall& c, int local, SpanWords& out,
                                        absl::FunctionRef<void(std::byte*)>* fill, Parts* parts) {
  // What this node's ranks say about the call (every rank reads every local rank's words).
  Agreement here{.signature_min = UINT64_MAX,
                 .signature_max = 0,
                 .group_nonfinite = 0,
                 .nonfinite_ranks = 0,
                 .first_nonfinite_rank = INT64_MAX};
  for (int l = 0; l < local; ++l) {
    const SpanWords& w = Words(c, l);
    here.signature_min = std::min(here.signature_min, w.signature);
    here.signature_max = std::max(here.signature_max, w.signature);
    if (w.nonfinite > 0) {
      here.group_nonfinite += std::min<uint64_t>(w.nonfinite, UINT32_MAX);
      ++here.nonfinite_ranks;
      here.first_nonfinite_rank =
          std::min<int64_t>(here.first_nonfinite_rank, GlobalRank(s_.node_index, l));
    }
  }
  const size_t slot = kSlotHeader + InlineBytes();
  const size_t nodes = s_.layout.size();
  if (slot_.size() < slot) slot_.resize(slot);
  if (slots_.size() < slot * nodes) slots_.resize(slot * nodes);
  std::memcpy(slot_.data(), &here, sizeof(here));
  if (fill != nullptr) (*fill)(slot_.data() + kSlotHeader);
  gloo::AllgathervOptions opts(context_);
  opts.setInput(reinterpret_cast<uint8_t*>(slot_.data()), slot);
  opts.setOutput(reinterpret_cast<uint8_t*>(slots_.data()), std::vector<size_t>(nodes, slot));
  {
    const SpanProfile::Timer timer(this->timer());
    gloo::allgatherv(opts);
  }
  Agreement a;
  std::memcpy(&a, slots_.data(), sizeof(a));
  for (size_t k = 1; k < nodes; ++k) {
    Agreement b;
    std::memcpy(&b, slots_.data() + k * slot, sizeof(b));
    Combine(a, b);
  }
  RETURN_IF_ERROR(Settle(s_.group, c.call, a, out));
  if (parts != nullptr) {
    parts->clear();
    for (size_t k = 0; k < nodes; ++k) parts->push_back(slots_.data() + k * slot + kSlotHeader);
  }
  return absl::OkStatus();
}

void SpanAgreement::Publish(SpanWords& mine, const absl::Status& st) {
  mine.code = static_cast<int32_t>(st.code());
  const std::string text(st.message().substr(0, sizeof(mine.text)));
  std::memcpy(mine.text, text.data(), text.size());
  mine.text_bytes = static_cast<uint32_t>(text.size());
  if (!st.ok() && st.code() != absl::StatusCode::kInvalidArgument &&
      st.code() != absl::StatusCode::kAborted) {
    RequestAbort("the exchange between nodes", st.message());
  }
}

absl::Status SpanAgreement::Outcome(const SpanWords& w) {
  if (w.code == 0) return absl::OkStatus();
  const absl::Status st(static_cast<absl::StatusCode>(w.code),
                        std::string(w.text, std::min<size_t>(w.text_bytes, sizeof(w.text))));
  if (st.code() != absl::StatusCode::kInvalidArgument) {
    failed_ = absl::Status(
        st.code() == absl::StatusCode::kAborted ? st.code() : absl::StatusCode::kFailedPrecondition,
        absl::StrCat("group ", s_.group,
                     " failed for good at an earlier collective: ", st.message()));
  }
  return st;
}

void SpanAgreement::RequestAbort(absl::string_view what, absl::string_view why) const {
  if (!s_.request_abort) return;  // it cuts the reason to what the daemon takes
  s_.request_abort(absl::StrCat(what, " failed on node ", node_name(), ": ", why));
}

absl::Status SpanAgreement::Guarded(CollectiveOp kind, absl::FunctionRef<absl::Status()> exchange) {
  try {
    return exchange();
  } catch (const std::exception& e) {
    // A peer that went away has usually been aborted: its node tells every node within a
    // few milliseconds (docs/cluster.md), and the abort's reason says more than a closed
    // connection. Wait for it a little.
    for (int i = 0; i < 100 && !Aborted(); ++i) absl::SleepFor(absl::Milliseconds(10));
    const std::string what = absl::StrCat(CollectiveName(kind), " on group ", s_.group,
                                          ": the exchange between nodes (node ", node_name(), ", ",
                                          s_.layout.size(), " nodes) failed: ", e.what());
    return Aborted() ? absl::AbortedError(what) : absl::UnavailableError(what);
  }
}

absl::Status SpanAgreement::Connect() {
  const SpanProfile::Timer timer(this->timer());
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
  GlooStore store(s_.store,
                  absl::StrCat("commd.span/", s_.group, "/", s_.formation, "/", s_.local_rank, "/"),
                  s_.connect_wait, [this] { return Aborted(); });
  ASSIGN_OR_RETURN(const std::string proofs, Proofs(nodes));
  store.set(absl::StrCat("proof/", s_.node_index), std::vector<char>(proofs.begin(), proofs.end()));
  context->connectFullMesh(store, device);
  RETURN_IF_ERROR(Authenticate(s_, context, store, proofs));
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

bool SpanAgreement::Aborted() {
  if (s_.abort_word != nullptr && __atomic_load_n(s_.abort_word, __ATOMIC_ACQUIRE) != 0) {
    return true;
  }
  absl::MutexLock lock(&mu_);
  return closed_;
}

void SpanAgreement::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  if (context_ != nullptr) Fail(*context_, s_.group);
}

}  // namespace commd
