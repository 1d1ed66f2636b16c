// Internal to the SDK: the agreement between the nodes of a group that spans nodes, which the
// host backend (span_collectives.h) and the CUDA one (cuda_span_collectives.h) both hold.
//
// What it owns:
//   the words     a small symmetric buffer of the group's in host memory (SpanWords per rank,
//                 allocated on the group's first collective), through which a node's ranks
//                 meet: each writes its call's signature and NaN/Inf count; the leader (local
//                 rank 0) writes the outcome, which every local rank reads;
//   the formation this rank's gloo full mesh with the same local rank of every other node (the
//                 leaders' for local rank 0), made on its first exchange: addresses and proofs
//                 of identity through the job's store (the cluster's: the same on every node)
//                 under "commd.span/<group>/<formation>/<local rank>/", keys deleted once every
//                 peer is connected;
//   the gather    the leaders' first exchange of every call: one gloo all-gatherv of a slot per
//                 node whose size depends on the layout only, holding the node's range of
//                 signatures and NaN/Inf counts (a call that differs on any rank of any node
//                 fails everywhere there, before data move, whatever each rank called), with
//                 room for a small payload the host backend fills (its one-exchange all-reduce);
//   the abort     Close fails every gloo connection (pair access), so a rank blocked on a peer
//                 node returns at once; a failed exchange asks the daemon to abort the group on
//                 every node and fails every later call of the group (failed()).
//
// Usage (the CUDA backend's: the agreement alone, before anything is enqueued):
//   SpanAgreement agreement(std::move(setup));
//   RETURN_IF_ERROR(agreement.Agree(checked));  // every rank of every node made this call
//
// Not thread-safe but for Close (any thread) and Aborted: one calling thread per rank.
#ifndef COMMD_CLIENT_SRC_SPAN_AGREEMENT_H_
#define COMMD_CLIENT_SRC_SPAN_AGREEMENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/src/collective_call.h"
#include "commd/group.h"
#include "commd/store.h"
#include "kernels/host/comm_view.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace commd {

// One rank's words of the group's span words buffer (kSpanWordsBytes per rank).
inline constexpr size_t kSpanWordsBytes = 1024;

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
  // its lane's (span_profile.h).
  int64_t lead_ns;
  int64_t lane_ns;
  char text[kSpanWordsBytes - 64];
};
static_assert(sizeof(SpanWords) == kSpanWordsBytes);

struct SpanSetup {
  std::string group;  // the group's name
  uint64_t formation = 0;
  int local_rank = 0;
  int local_world_size = 1;
  int global_world_size = 1;
  std::vector<NodeRanks> layout;  // sorted by node name, as the daemon answered
  int node_index = 0;
  Store* store = nullptr;       // the job's store, the same on every node
  absl::Duration connect_wait;  // how long the leaders wait for each other to connect
  const uint32_t* abort_word = nullptr;
  uint64_t* heartbeat_ns = nullptr;
  // Asks the daemon to abort the group (best effort), with this reason.
  std::function<void(const std::string&)> request_abort;
};

class SpanAgreement {
 public:
  // Every node's payload in the gather, in node order (InlineBytes() each).
  using Parts = absl::InlinedVector<const std::byte*, 16>;

  // `timed`: the exchanges between nodes add their time to a counter (TakeTime).
  explicit SpanAgreement(SpanSetup setup, bool timed = false);
  ~SpanAgreement();
  SpanAgreement(const SpanAgreement&) = delete;
  SpanAgreement& operator=(const SpanAgreement&) = delete;

  const SpanSetup& setup() const { return s_; }
  bool leader() const { return s_.local_rank == 0; }
  const std::string& node_name() const {
    return s_.layout[static_cast<size_t>(s_.node_index)].node;
  }
  int GlobalRank(int node, int local) const {
    return s_.layout[static_cast<size_t>(node)].global_ranks[static_cast<size_t>(local)];
  }
  // The node index and local rank of `global_rank`; {-1, -1} when the layout lacks it.
  std::pair<int, int> Locate(int global_rank) const;

  // The agreement alone (the CUDA backend's, before it enqueues anything): writes this rank's
  // call signature to its words of c.span_words, meets the node's ranks there and, through
  // the leaders, every node's. OK when every rank of every node made this call;
  // INVALID_ARGUMENT on every rank when any differs; ABORTED or a failure between the nodes
  // as for a collective (every later call then fails too). Blocks until every rank has
  // called or the call's wait ends.
  absl::Status Agree(const CheckedCall& c);

  // The parts a backend's own round through the words is made of (span_collectives.cc).
  //
  // Local rank `rank`'s words of the call.
  static SpanWords& Words(const CheckedCall& c, int rank) {
    return *reinterpret_cast<SpanWords*>(c.span_words->data[rank]);
  }
  // Before the first barrier: this rank's signature of `call` and NaN/Inf count into `mine`.
  void Sign(const CollectiveCall& call, uint64_t nonfinite, SpanWords& mine) const;
  // The leader's, before its exchange: no finding yet (an exchange that fails leaves none).
  static void ClearFinding(SpanWords& out);
  // The leader's first exchange (after Connect, within Guarded): every node's agreement
  // gathered, the group's NaN/Inf finding into `out`; INVALID_ARGUMENT when any rank of any
  // node made another call. `local` is the node's number of ranks (whose words are read).
  absl::Status Gather(const CheckedCall& c, int local, SpanWords& out);
  // The same with this node's payload in its slot: `fill` writes it (InlineBytes() at most)
  // and, when the agreement holds, `parts` gets every node's (valid until the next Gather).
  absl::Status Gather(const CheckedCall& c, int local, SpanWords& out,
                      absl::FunctionRef<void(std::byte*)> fill, Parts& parts);
  // Bytes of payload each node's slot carries: they depend on the layout only.
  size_t InlineBytes() const;
  // Writes `st` to this rank's words for its node's ranks to read; a failure between the
  // nodes (anything but a refused call, or the group's abort itself, which the daemon already
  // has) asks the daemon to abort the group, since the exchanges are out of step from there on
  // (the daemon aborts it on every node).
  void Publish(SpanWords& mine, const absl::Status& st);
  // The status `w` carries. Anything but a refused call leaves the group failed for good:
  // an aborted group stays ABORTED, any other failure leaves it out of step.
  absl::Status Outcome(const SpanWords& w);
  // OK until an outcome failed the group for good; then what every later call returns.
  const absl::Status& failed() const { return failed_; }

  // This rank's gloo full mesh with its lane of every node (the leaders' for local rank 0),
  // made on the lane's first exchange. Blocks until every peer has connected and proved it is
  // that node's rank, or the setup's connect_wait passes.
  absl::Status Connect();
  // The mesh Connect made (null before): used by the calling thread only.
  const std::shared_ptr<gloo::Context>& context() const { return context_; }
  // `exchange` (gloo calls on context()) with gloo's failures as UNAVAILABLE (ABORTED once the
  // group was aborted), naming `kind`.
  absl::Status Guarded(CollectiveOp kind, absl::FunctionRef<absl::Status()> exchange);
  // Asks the daemon to abort the group on every node (best effort): `what` failed on this
  // node, for `why`.
  void RequestAbort(absl::string_view what, absl::string_view why) const;

  // Whether the group was aborted (its abort word) or closed. Any thread.
  bool Aborted();
  // Ends this rank's connections to the other nodes: a rank blocked on a peer node returns
  // with an error, and no later connection is made. The client's event thread calls it when
  // the group is aborted; any thread, while a call runs.
  void Close();

  // Where exchanges between nodes add their time, null unless timed.
  int64_t* timer() { return timed_ ? &across_ns_ : nullptr; }
  // The time added since the last TakeTime, and starts again from 0.
  int64_t TakeTime() { return std::exchange(across_ns_, 0); }

 private:
  absl::Status GatherSlots(const CheckedCall& c, int local, SpanWords& out,
                           absl::FunctionRef<void(std::byte*)>* fill, Parts* parts);

  const SpanSetup s_;
  const bool timed_;
  int64_t across_ns_ = 0;  // the call's time in exchanges between nodes so far, when timed
  absl::Status failed_;    // set once an exchange failed: every later call fails
  std::vector<std::byte> slot_, slots_;  // the gather's, kept: every call's are the same size
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Written once under mu_ (Connect), then read by the calling thread without it.
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_SPAN_AGREEMENT_H_
