// Internal to the SDK: a group's point-to-point sends and receives (Group::Send and friends;
// docs/architecture.md "Point-to-point"). Each (sender, receiver, tag) of the group is a
// channel: a two-rank group of its own, formed by its first message, with a staging buffer
// and a thread of this rank that moves the channel's messages in order. Channels progress
// independently of each other and of the caller, which is what lets a ring of sends posted
// before their receives complete.
#ifndef COMMD_CLIENT_SRC_POINT_TO_POINT_H_
#define COMMD_CLIENT_SRC_POINT_TO_POINT_H_

#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  absl::StatusOr<Channel*> ChannelFor(const PointToPoint& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PointToPointParent parent_;
  absl::Mutex mu_;
  std::map<Key, std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::string aborted_ ABSL_GUARDED_BY(mu_);  // the parent's abort, once it came
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_POINT_TO_POINT_H_
