// A group's point-to-point channels (point_to_point.h).
#include "client/src/point_to_point.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/src/client_impl.h"
#include "client/src/group_aborted.h"
#include "client/src/group_state.h"
#include "common/status_macros.h"
#include "kernels/host/barrier.h"
#include "kernels/types.h"

namespace commd {

// One posted send or receive: the channel's thread writes its status, then notifies. A
// receive from any source gets its peer (and `source`) when a sender's channel takes it.
struct PointToPointMessage {
  PointToPoint op;
  std::atomic<int> source{-1};
  absl::Notification done;
  absl::Status status;
};

struct PointToPointRequest::State {
  std::vector<std::shared_ptr<PointToPointMessage>> messages;
};

PointToPointRequest::PointToPointRequest(std::unique_ptr<State> state) : state_(std::move(state)) {}
PointToPointRequest::~PointToPointRequest() { (void)Wait(); }

absl::Status PointToPointRequest::Wait() {
  absl::Status first;
  for (const auto& m : state_->messages) {
    m->done.WaitForNotification();
    if (first.ok()) first = m->status;
  }
  return first;
}

int PointToPointRequest::source(size_t i) const {
  return i < state_->messages.size() ? state_->messages[i]->source.load() : -1;
}

bool PointToPointRequest::Done() const {
  return std::all_of(state_->messages.begin(), state_->messages.end(),
                     [](const auto& m) { return m->done.HasBeenNotified(); });
}

namespace {

const char* KindWords(PointToPoint::Kind kind) {
  return kind == PointToPoint::Kind::kSend ? "send" : "receive";
}

// What an op is in messages: "send of 1000 float32 to rank 1 (tag 0)".
std::string Describe(const PointToPoint& op) {
  return absl::StrCat(KindWords(op.kind), " of ", op.count, " ", DataTypeName(op.dtype),
                      op.kind == PointToPoint::Kind::kSend ? " to rank " : " from ",
                      op.peer == kAnySource ? "any rank" : absl::StrCat(op.peer), " (tag ", op.tag,
                      ")");
}

absl::Status Check(const PointToPoint& op, int self, int ranks) {
  if (op.kind != PointToPoint::Kind::kSend && op.kind != PointToPoint::Kind::kRecv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "point-to-point kind ", static_cast<int>(op.kind), " is neither send (0) nor receive (1)"));
  }
  const bool any = op.peer == kAnySource && op.kind == PointToPoint::Kind::kRecv;
  if (!any && (op.peer < 0 || op.peer >= ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(KindWords(op.kind), ": peer ", op.peer, " is out of range (allowed: 0..",
                     ranks - 1, ", not this rank ", self,
                     op.kind == PointToPoint::Kind::kRecv ? "; or kAnySource (-1)" : "", ")"));
  }
  if (op.peer == self) {
    return absl::InvalidArgumentError(absl::StrCat(KindWords(op.kind), ": peer ", op.peer,
                                                   " is this rank (allowed: 0..", ranks - 1,
                                                   " but ", self, ")"));
  }
  if (op.tag < 0) {
    return absl::InvalidArgumentError(absl::StrCat(KindWords(op.kind), ": tag ", op.tag,
                                                   " is out of range (allowed: 0..",
                                                   kMaxPointToPointTag, ")"));
  }
  RETURN_IF_ERROR(kernels::CheckCollectiveType(op.dtype));
  if (op.count > 0 && op.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(op), ": data is null (allowed only with count 0)"));
  }
  if (op.count > SIZE_MAX / DataTypeSize(op.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(op), ": count overflows the address space"));
  }
  return absl::OkStatus();
}

// The two-rank group of channel (from, to, tag) as this rank joins it: on one node, ranks 0
// (the sender) and 1; across nodes, one rank on each of two nodes.
GroupOptions ChannelOptions(const PointToPointParent& p, int from, int to, int tag) {
  GroupOptions o = p.options;
  o.name = absl::StrCat(p.name, "/p2p/", from, "-", to, "/", tag);
  const bool sends = from == p.self;
  const int peer = sends ? to : from;
  if (!p.node_of.empty() && p.node_of[peer] != p.node_of[p.self]) {
    o.rank = 0;
    o.world_size = 1;
    o.global_rank = sends ? 0 : 1;
    o.global_world_size = 2;
  } else {
    o.rank = sends ? 0 : 1;
    o.world_size = 2;
    o.global_rank = p.global_rank;
    o.global_world_size = 0;
  }
  return o;
}

}  // namespace

class PointToPointChannels::Channel {
 public:
  Channel(const PointToPointParent& parent, const Key& key)
      : client_(parent.client),
        options_(ChannelOptions(parent, std::get<0>(key), std::get<1>(key), std::get<2>(key))),
        thread_([this] { Run(); }) {}

  ~Channel() {
    End(absl::CancelledError(
        absl::StrCat("group ", options_.name, " was left with this message not yet moved")));
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    thread_.join();
  }

  void Post(std::shared_ptr<PointToPointMessage> m) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(m));
  }

  // A receive from any source waits on this channel (this rank its receiver): form it now,
  // before a message is posted, so that the sender's first message can be seen waiting. A
  // failed join (the sender never came within the rendezvous timeout) is tried again by a
  // later call, at most once a second.
  void Ready() {
    absl::MutexLock lock(&mu_);
    if (own_pad_ != nullptr || form_wanted_ || absl::Now() < retry_after_) return;
    form_wanted_ = true;
  }

  // Takes `m`, a receive from any source, when the channel has nothing of its own to move
  // and its sender `from` waits in the message this rank has yet to receive; then posts it.
  bool Offer(const std::shared_ptr<PointToPointMessage>& m, int from) {
    absl::MutexLock lock(&mu_);
    if (!ended_.ok() || !queue_.empty() || busy_ || own_pad_ == nullptr) return false;
    // The channel's group: the sender is rank 0, this rank 1; its thread is idle (not busy,
    // nothing queued), so this rank's exchange count holds still while it is read.
    if (!kernels::PeerAwaitsNextExchange(own_pad_, 1, 2, 0)) return false;
    m->op.peer = from;
    m->source = from;
    queue_.push_back(m);
    return true;
  }

  // Queued and later messages fail with `status`; one in flight ends too (its join is
  // cancelled, or its group aborted, which its peer's side then reports).
  void End(const absl::Status& status) {
    bool abort_group = false;
    {
      absl::MutexLock lock(&mu_);
      if (!ended_.ok()) return;
      ended_ = status;
      if (joining_ != nullptr) joining_->TryCancel();
      abort_group = busy_ && formed_;
    }
    if (abort_group) client_->RequestAbort(options_.name, std::string(status.message()));
  }

 private:
  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || closing_ || form_wanted_;
  }

  void Run() {
    for (;;) {
      std::shared_ptr<PointToPointMessage> m;
      absl::Status ended;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Channel::HasWork));
        if (queue_.empty() && closing_) return;
        if (queue_.empty()) {  // form_wanted_: Ready's early formation
          form_wanted_ = false;
          if (!ended_.ok()) continue;
          mu_.Unlock();
          const absl::Status formed = staging_ == nullptr ? Form() : absl::OkStatus();
          mu_.Lock();
          if (!formed.ok()) retry_after_ = absl::Now() + absl::Seconds(1);
          continue;
        }
        m = std::move(queue_.front());
        queue_.pop_front();
        ended = ended_;
        busy_ = ended.ok();
      }
      absl::Status s = ended.ok() ? Move(m->op) : ended;
      {
        absl::MutexLock lock(&mu_);
        busy_ = false;
        if (!s.ok() && !ended_.ok()) s = ended_;  // what ended it, not the abort it caused
      }
      m->status = std::move(s);
      m->done.Notify();
    }
  }

  // Joins the channel's group (unless an earlier message did) and allocates its staging
  // buffer. A failed join or allocation is tried again by the next message.
  absl::Status Form() {
    if (group_ == nullptr) {
      std::unique_ptr<grpc::ClientContext> context = client_->WaitingContext(options_.timeout);
      {
        absl::MutexLock lock(&mu_);
        if (!ended_.ok()) return ended_;
        joining_ = context.get();
      }
      absl::StatusOr<std::unique_ptr<Group>> group = Join(client_, options_, *context);
      absl::MutexLock lock(&mu_);
      joining_ = nullptr;
      if (!group.ok()) return group.status();
      group_ = std::move(*group);
      formed_ = true;  // from here End aborts the group, which also ends the allocation
      if (!ended_.ok()) return ended_;  // ended while joining: allocate nothing
    }
    ASSIGN_OR_RETURN(staging_, group_->AllocateSymmetric(kPointToPointStagingBytes));
    absl::MutexLock lock(&mu_);
    own_pad_ = staging_->signal_pad(group_->rank());
    return absl::OkStatus();
  }

  // One message: a broadcast from the sender (rank 0 of the channel's group), in pieces of
  // the staging buffer's size, recorded as one entry.
  absl::Status Move(const PointToPoint& op) {
    if (staging_ == nullptr) {
      if (absl::Status s = Form(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(Describe(op), ": ", s.message()));
      }
    }
    const size_t size = DataTypeSize(op.dtype);
    const int64_t dims[1] = {static_cast<int64_t>(op.count)};
    const TensorDesc t{dims, 1, op.dtype};
    Recorder& rec = group_->recorder();
    const RecordId id =
        rec.Begin(CollectiveOp::kBroadcast, {&t, 1}, {&t, 1}, /*peer=*/-1,
                  static_cast<uint64_t>(absl::ToInt64Milliseconds(options_.timeout)));
    rec.Started(id);
    CollectiveOptions piece_options;
    piece_options.part_of = id;
    auto* bytes = static_cast<std::byte*>(op.data);
    absl::Status s;
    size_t moved = 0;
    do {
      const size_t n = std::min(op.count - moved, kPointToPointStagingBytes / size);
      s = group_->Broadcast(bytes + moved * size, n, op.dtype, /*root=*/0, *staging_,
                            piece_options);
      moved += n;
    } while (s.ok() && moved < op.count);
    if (!s.ok()) {
      rec.Abandoned(id);
      return absl::Status(s.code(), absl::StrCat(Describe(op), " in channel ", options_.name,
                                                 ", whose rank 0 is the sender: ", s.message()));
    }
    rec.Completed(id);
    return absl::OkStatus();
  }

  const std::shared_ptr<Client::Impl> client_;
  const GroupOptions options_;
  // Used by the channel's thread only.
  std::unique_ptr<Group> group_;
  std::unique_ptr<SymmetricBuffer> staging_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<PointToPointMessage>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* joining_ ABSL_GUARDED_BY(mu_) = nullptr;  // the join in progress
  bool formed_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a message is being moved
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // Ready's: a formation wanted before any message, and when a failed one may be tried again.
  bool form_wanted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // This rank's signal pad of the staging buffer, once formed (Offer reads it).
  const uint32_t* own_pad_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // last: it starts once the rest is built
};

PointToPointChannels::PointToPointChannels(PointToPointParent parent)
    : parent_(std::move(parent)) {}

PointToPointChannels::~PointToPointChannels() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (dispatcher_.joinable()) dispatcher_.join();
  absl::MutexLock lock(&mu_);
  for (AnySource& a : any_source_) {
    a.message->status = absl::CancelledError(absl::StrCat(
        "group ", parent_.name, " was left with this receive from any source not yet matched"));
    a.message->done.Notify();
  }
  any_source_.clear();
  channels_.clear();
}

absl::StatusOr<std::unique_ptr<Group>> PointToPointChannels::Join(
    const std::shared_ptr<Client::Impl>& client, const GroupOptions& options,
    grpc::ClientContext& context) {
  return Client::Join(client, options, context);
}

absl::StatusOr<PointToPointChannels::Channel*> PointToPointChannels::ChannelFor(
    const PointToPoint& op) {
  const bool sends = op.kind == PointToPoint::Kind::kSend;
  const Key key{sends ? parent_.self : op.peer, sends ? op.peer : parent_.self, op.tag};
  std::unique_ptr<Channel>& c = channels_[key];
  if (c == nullptr) {
    if (channels_.size() > static_cast<size_t>(kMaxPointToPointChannels)) {
      channels_.erase(key);
      return absl::ResourceExhaustedError(absl::StrCat(
          Describe(op), ": this rank has ", kMaxPointToPointChannels,
          " point-to-point channels open in group ", parent_.name,
          " (one per direction, peer and tag; at most kMaxPointToPointChannels): reuse tags"));
    }
    c = std::make_unique<Channel>(parent_, key);
  }
  return c.get();
}

absl::Status PointToPointChannels::CheckAnySource(const PointToPoint& op) {
  for (int from = 0; from < parent_.ranks; ++from) {
    if (from == parent_.self) continue;
    if (!parent_.node_of.empty() && parent_.node_of[from] != parent_.node_of[parent_.self]) {
      return absl::UnimplementedError(absl::StrCat(
          Describe(op), " in group ", parent_.name, ": rank ", from,
          " is on another node, and a receive from any source looks for a sender waiting in "
          "shared memory; name the sender on a group that spans nodes"));
    }
    PointToPoint from_peer = op;
    from_peer.peer = from;
    RETURN_IF_ERROR(ChannelFor(from_peer).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PointToPointRequest>> PointToPointChannels::Start(
    std::span<const PointToPoint> ops) {
  for (const PointToPoint& op : ops) RETURN_IF_ERROR(Check(op, parent_.self, parent_.ranks));
  absl::MutexLock lock(&mu_);
  if (!aborted_.empty()) return GroupAbortedError(parent_.name, aborted_, "");
  std::vector<Channel*> channels;  // null: a receive from any source
  for (const PointToPoint& op : ops) {
    if (op.peer == kAnySource) {
      RETURN_IF_ERROR(CheckAnySource(op));
      channels.push_back(nullptr);
      continue;
    }
    ASSIGN_OR_RETURN(Channel * c, ChannelFor(op));
    channels.push_back(c);
  }
  auto state = std::make_unique<PointToPointRequest::State>();
  for (size_t i = 0; i < ops.size(); ++i) {
    auto m = std::make_shared<PointToPointMessage>();
    m->op = ops[i];
    if (channels[i] != nullptr) {
      m->source = ops[i].peer;
      channels[i]->Post(m);
    } else {
      any_source_.push_back({m, absl::Now() + parent_.options.timeout});
      if (!dispatcher_.joinable()) dispatcher_ = std::thread([this] { Dispatch(); });
    }
    state->messages.push_back(std::move(m));
  }
  return std::make_unique<PointToPointRequest>(std::move(state));
}

bool PointToPointChannels::MatchAnySource() {
  bool matched = false;
  const absl::Time now = absl::Now();
  for (auto it = any_source_.begin(); it != any_source_.end();) {
    const std::shared_ptr<PointToPointMessage>& m = it->message;
    bool taken = false;
    for (int i = 1; i < parent_.ranks && !taken; ++i) {
      const int from = (parent_.self + i) % parent_.ranks;
      Channel& c = *channels_.at(Key{from, parent_.self, m->op.tag});
      c.Ready();
      taken = c.Offer(m, from);
    }
    if (!taken && now < it->deadline) {
      ++it;
      continue;
    }
    if (!taken) {
      m->status = absl::DeadlineExceededError(
          absl::StrCat(Describe(m->op), " in group ", parent_.name, ": no rank sent it within ",
                       absl::FormatDuration(parent_.options.timeout), " (the group's timeout)"));
      m->done.Notify();
    }
    matched |= taken;
    it = any_source_.erase(it);
  }
  return matched;
}

void PointToPointChannels::Dispatch() {
  constexpr absl::Duration kFirstNap = absl::Microseconds(20), kLongestNap = absl::Milliseconds(1);
  absl::Duration nap = kFirstNap;
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(this, &PointToPointChannels::DispatcherHasWork));
    if (stopping_) return;
    nap = MatchAnySource() ? kFirstNap : std::min(nap * 2, kLongestNap);
    if (!any_source_.empty()) {
      const bool stopping = mu_.AwaitWithTimeout(absl::Condition(&stopping_), nap);
      if (stopping) return;
    }
  }
}

void PointToPointChannels::Abort(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.empty()) return;
  aborted_ = why.empty() ? "(no reason given)" : why;
  const absl::Status status = GroupAbortedError(parent_.name, aborted_, "");
  for (auto& [key, channel] : channels_) channel->End(status);
  for (AnySource& a : any_source_) {
    a.message->status = status;
    a.message->done.Notify();
  }
  any_source_.clear();
}

absl::StatusOr<std::unique_ptr<PointToPointRequest>> Group::StartPointToPoint(
    std::span<const PointToPoint> ops) {
  if (!state_->options.device.is_host()) {
    return absl::UnimplementedError(absl::StrCat(
        "point-to-point on group ", name(), " (", device().ToString(),
        "): this SDK sends and receives on host-memory groups only; use NCCL's send/recv for "
        "CUDA tensors (\"cpu:commd,cuda:nccl\")"));
  }
  return state_->p2p->Start(ops);
}

absl::StatusOr<std::unique_ptr<PointToPointRequest>> Group::ISend(const void* data, size_t count,
                                                                  DataType dtype, int peer,
                                                                  int tag) {
  const PointToPoint op{.kind = PointToPoint::Kind::kSend,
                        .data = const_cast<void*>(data),  // a send only reads it
                        .count = count,
                        .dtype = dtype,
                        .peer = peer,
                        .tag = tag};
  return StartPointToPoint({&op, 1});
}

absl::StatusOr<std::unique_ptr<PointToPointRequest>> Group::IRecv(void* data, size_t count,
                                                                  DataType dtype, int peer,
                                                                  int tag) {
  const PointToPoint op{.kind = PointToPoint::Kind::kRecv,
                        .data = data,
                        .count = count,
                        .dtype = dtype,
                        .peer = peer,
                        .tag = tag};
  return StartPointToPoint({&op, 1});
}

absl::Status Group::Send(const void* data, size_t count, DataType dtype, int peer, int tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<PointToPointRequest> request,
                   ISend(data, count, dtype, peer, tag));
  return request->Wait();
}

absl::Status Group::Recv(void* data, size_t count, DataType dtype, int peer, int tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<PointToPointRequest> request,
                   IRecv(data, count, dtype, peer, tag));
  return request->Wait();
}

}  // namespace commd
