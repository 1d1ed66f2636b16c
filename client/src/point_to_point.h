// Internal to the SDK: a group's point-to-point sends and receives (Group::Send and friends;
// docs/architecture.md "Point-to-point"). Each (sender, receiver, tag) of the group is a
// channel: a two-rank group of its own, formed by its first message, with a staging buffer
// and a thread of this rank that moves the channel's messages in order. Channels progress
// independently of each other and of the caller, which is what lets a ring of sends posted
// before their receives complete.
#ifndef COMMD_CLIENT_SRC_POINT_TO_POINT_H_
#define COMMD_CLIENT_SRC_POINT_TO_POINT_H_

#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/commd.h"
#include "commd/group.h"

namespace commd {

// Bytes of a channel's staging buffer (each of its two ranks has one): a message larger than
// this moves in pieces of this size, all of one flight-recorder entry.
inline constexpr size_t kPointToPointStagingBytes = size_t{1} << 20;

// Where the parent group's ranks are: what a channel's join needs of it.
struct PointToPointParent {
  std::shared_ptr<Client::Impl> client;
  GroupOptions options;  // the parent's; a channel keeps its timeout, policies, description
  std::string name;
  int self = 0;         // this rank's place in [0, ranks): Group::rank, or global_rank spanning
  int ranks = 0;        // Group::global_world_size
  int global_rank = 0;  // the member's global rank (names a node-local channel's dump files)
  std::vector<int> node_of;  // by rank, for a spanning group: its node's index; else empty
};

struct PointToPointMessage;

// Receives from any source (kAnySource) wait in the channels' dispatcher: it readies the
// channel of every possible sender with the receive's tag, looks in each idle one for a sender
// waiting in its next message (kernels::PeerAwaitsNextExchange: the sender's half of the
// broadcast's exchange is already in this rank's memory), and posts the receive on the first
// it finds, in the order the receives were posted. It looks again after a nap that grows from
// 20 us to 1 ms while nothing comes.
class PointToPointChannels {
 public:
  explicit PointToPointChannels(PointToPointParent parent);
  // Fails what is queued (CANCELLED), ends what is in flight (aborting its channel) and
  // joins every channel's thread.
  ~PointToPointChannels();
  PointToPointChannels(const PointToPointChannels&) = delete;
  PointToPointChannels& operator=(const PointToPointChannels&) = delete;

  // Checks every op (INVALID_ARGUMENT naming the first bad one, nothing posted), then posts
  // each on its channel.
  absl::StatusOr<std::unique_ptr<PointToPointRequest>> Start(std::span<const PointToPoint> ops);
  // The parent group was aborted (`why`: Group::abort_reason's words): messages in flight end
  // with ABORTED, and so does every later one.
  void Abort(const std::string& why);

 private:
  class Channel;
  // Client::Join, which befriends this class (its channels' threads call it).
  static absl::StatusOr<std::unique_ptr<Group>> Join(const std::shared_ptr<Client::Impl>& client,
                                                     const GroupOptions& options,
                                                     grpc::ClientContext& context);
  using Key = std::tuple<int, int, int>;  // sender, receiver, tag
  struct AnySource {
    std::shared_ptr<PointToPointMessage> message;
    absl::Time deadline;  // the parent group's timeout from the post
  };
  absl::StatusOr<Channel*> ChannelFor(const PointToPoint& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The channels a receive from any source with `tag` may take its message from (every other
  // rank's to this one), made if missing; INVALID_ARGUMENT, UNIMPLEMENTED or
  // RESOURCE_EXHAUSTED as ChannelFor when one cannot be.
  absl::Status CheckAnySource(const PointToPoint& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Offers each waiting receive from any source to the channels; true if one was taken.
  bool MatchAnySource() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Dispatch();  // the dispatcher's thread
  bool DispatcherHasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !any_source_.empty() || stopping_;
  }

  const PointToPointParent parent_;
  absl::Mutex mu_;
  std::map<Key, std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::string aborted_ ABSL_GUARDED_BY(mu_);               // the parent's abort, once it came
  std::deque<AnySource> any_source_ ABSL_GUARDED_BY(mu_);  // in the order posted
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread dispatcher_;  // started by the first receive from any source
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_POINT_TO_POINT_H_
