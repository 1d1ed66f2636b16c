// Internal to the SDK: what a Group and a SymmetricBuffer hold (group.cc manages them;
// collectives.cc reads the group's collective settings, its recorder's ring writer, its
// collective backend and the buffers' cached views).
#ifndef COMMD_CLIENT_SRC_GROUP_STATE_H_
#define COMMD_CLIENT_SRC_GROUP_STATE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/src/client_impl.h"
#include "client/src/collective_call.h"
#include "client/src/group_aborted.h"
#include "client/src/point_to_point.h"
#include "client/src/recorder_impl.h"
#include "client/src/span_collectives.h"
#include "commd/group.h"
#include "commd/v1/groups.pb.h"
#include "common/unique_fd.h"

namespace commd {

// The group's other ranks' processes, watched with pidfds opened at join: a wait that times
// out can then tell a peer that exited from a slow one. (The daemon aborts the group when a
// member dies; this covers a peer that closed its session before it exited, or a daemon that
// could not act.)
struct PeerProcesses {
  std::vector<int64_t> pids;     // by rank
  std::vector<UniqueFd> pidfds;  // by rank; empty for this rank or where pidfd_open failed
  // "rank 1 (pid 4711) exited" for every peer whose process is gone, comma-separated; "" if none.
  std::string Exited() const;
};

struct SymmetricBuffer::State {
  std::shared_ptr<Client::Impl> client;
  uint64_t group_id = 0;
  int rank = 0;
  Device device = Device::Host();
  v1::SymmetricAllocation allocation;
  std::vector<std::unique_ptr<Mapping>> mappings;  // by rank
  BufferViews views;                               // over `mappings`, built once mapped
  // The last call of the owning group with this buffer as its one buffer that passed
  // Group::Run's checks, and what it resolved to (collective_call.h PreparedCall). Only the
  // owning group's collectives (one thread at a time) touch it.
  PreparedCall prepared;
};

struct Group::State {
  std::shared_ptr<Client::Impl> client;
  v1::JoinGroupResponse joined;
  std::vector<NodeRanks> layout;  // joined.layout(), as the SDK exposes it
  GroupOptions options;
  uint64_t timeout_ms = 0;  // options.timeout, as the flight recorder's entries record it
  // Read by every collective, so kept here once the group is joined: joined.world_size(),
  // Group::global_world_size(), and the wait of a call without its own timeout.
  int world_size = 0;
  int global_world_size = 0;
  absl::Duration default_wait;
  PeerProcesses peers;
  std::unique_ptr<Mapping> control_block;
  std::unique_ptr<Recorder> recorder;
  Recorder::Impl* recorder_impl = nullptr;  // recorder's, for what the public API lacks
  // What every collective's flight-recorder entry reads of the group, set by Group's
  // constructor (it names the Group) and unchanged after.
  std::optional<CollectiveEntry::GroupParts> entry_parts;
  // Abort callback: `hook` is registered with the client's event thread under the group's name.
  std::function<void(const std::string&)> hook;
  absl::Mutex callback_mu;
  std::function<void(const absl::Status&)> callback ABSL_GUARDED_BY(callback_mu);
  std::atomic<bool> callback_ran{false};
  // The control block's abort reason in words and its text (see Group::abort_reason), empty
  // while no abort was requested.
  std::string AbortReason() const;
  // `event_text`: the text of the daemon's abort event, used only when the control block
  // carries no abort (it is written before the event is sent).
  void RunCallbackOnce(const std::string& event_text) {
    absl::MutexLock lock(&callback_mu);
    if (!callback || callback_ran.exchange(true)) return;
    const std::string why = AbortReason();
    callback(GroupAbortedError(joined.name(), why, why.empty() ? event_text : ""));
  }
  // This rank's point-to-point channels in the group (Group::Send and friends).
  std::unique_ptr<PointToPointChannels> p2p;
  // A spanning group's words (span_collectives.h), allocated by its first collective.
  std::unique_ptr<SymmetricBuffer> span_words;
  // A spanning group's abort hook (SpanCollectives::close; empty for a node-local group):
  // ends the rank's waits on other nodes when the group is aborted. Borrows from `backend`.
  std::function<void()> close_span;
  // How the group's collectives run on its device, chosen at join; null for CUDA groups in
  // an SDK built without CUDA. Last, so destroyed first: the CUDA backend waits for enqueued
  // kernels, which read the control block's abort word.
  std::unique_ptr<CollectiveBackend> backend;
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_GROUP_STATE_H_
