#include "daemon/groups/group_registry.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/control_block_admin.h"
#include "common/log.h"
#include "common/names.h"
#include "common/shm_mapping.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "common/uid_share.h"

namespace commd::groups {

struct GroupRegistry::Member {
  bool joined = false;
  bool gone = false;
  bool died = false;  // gone because its process exited
  std::shared_ptr<const server::Session> session;
  int global_rank = -1;
  memory::Device device;
  std::shared_ptr<server::PendingCall> pending;  // while the rendezvous forms
  v1::JoinGroupResponse* response = nullptr;
  std::shared_ptr<const memory::Allocation> control_block;
  // The daemon's view of the control block: dumps and the watchdog read it. Shared, so a dump
  // in progress keeps it mapped even if the member is released meanwhile.
  std::shared_ptr<SharedMapping> control_map;
};

struct GroupRegistry::Round {
  struct Ask {
    uint64_t bytes = 0;
    std::shared_ptr<server::PendingCall> call;
    v1::SymmetricAllocation* response = nullptr;
  };
  std::map<int, Ask> asks;  // by rank
  server::TimerId timer = 0;
  std::optional<absl::Status> failed;  // later askers of a failed round get this at once
};

struct GroupRegistry::SymmetricBuffers {
  std::vector<std::shared_ptr<const memory::Allocation>> buffers;  // by rank
  std::vector<bool> released;
};

struct GroupRegistry::Group {
  uint64_t id = 0;
  Key key;
  int world_size = 0;
  bool active = false;
  bool retired = false;
  int joined = 0;
  std::vector<Member> members;
  absl::Time created;
  absl::Duration timeout;
  v1::WatchdogPolicy policy = v1::WATCHDOG_POLICY_UNSPECIFIED;
  v1::CollectiveSettings collectives;  // effective: the config's with the first rank's overrides
  server::TimerId timer = 0;
  std::vector<uint64_t> asks_made;  // AllocateSymmetric calls per rank = next round index
  std::map<uint64_t, Round> rounds;
  std::map<uint64_t, SymmetricBuffers> allocations;  // by allocation id (rank 0's)

  const std::string& name() const { return std::get<2>(key); }
  const std::string& job() const { return std::get<1>(key); }
};

namespace {

// How long a cancelled join waits for its session's end to say why it was cancelled.
constexpr absl::Duration kCancelSettleTime = absl::Milliseconds(300);

// "rank 2 (pid 4711) exited: killed by SIGKILL", "rank 2 (pid 4711) exited with status 3",
// "rank 2 (pid 4711) closed its session".
std::string DepartureText(int rank, int64_t pid, const server::SessionEnd& end) {
  const std::string who = absl::StrCat("rank ", rank, " (pid ", pid, ")");
  if (!end.process_exited()) return absl::StrCat(who, " closed its session");
  const std::string how = end.exit.ToString();
  return absl::StartsWith(how, "exited") ? absl::StrCat(who, " ", how)
                                         : absl::StrCat(who, " exited: ", how);
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

constexpr uint32_t kMaxNanSamplePeriod = 1000000;

// The config's settings with the request's overrides.
v1::CollectiveSettings EffectiveSettings(v1::CollectiveSettings settings,
                                         const v1::JoinGroupRequest& r) {
  if (r.nan_check() != v1::NAN_CHECK_UNSPECIFIED) settings.set_nan_check(r.nan_check());
  if (r.nan_sample_period() != 0) settings.set_nan_sample_period(r.nan_sample_period());
  if (r.nan_policy() != v1::NAN_POLICY_UNSPECIFIED) settings.set_nan_policy(r.nan_policy());
  return settings;
}

absl::Status ValidateJoin(const v1::JoinGroupRequest& r) {
  RETURN_IF_ERROR(ValidateName("group name", r.name()));
  if (r.world_size() < 1 || r.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", r.world_size(), " for group ",
                                                   r.name(), "; allowed 1 to ", kMaxWorldSize));
  }
  if (r.rank() < 0 || r.rank() >= r.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), " for group ", r.name(),
                                                   " of world size ", r.world_size(),
                                                   "; allowed 0 to ", r.world_size() - 1));
  }
  if (r.global_rank() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("global rank ", r.global_rank(), "; allowed -1 (same as rank) or more"));
  }
  if (!v1::WatchdogPolicy_IsValid(r.watchdog_policy())) {
    return absl::InvalidArgumentError(
        absl::StrCat("watchdog policy ", r.watchdog_policy(),
                     "; allowed 0 (the daemon's), 1 (report), 2 (notify), 3 (terminate)"));
  }
  if (r.nan_check() < v1::NAN_CHECK_UNSPECIFIED || r.nan_check() > v1::NAN_CHECK_SAMPLED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nan check ", r.nan_check(), "; allowed 0 (the daemon's), 1 (off), 2 (on), 3 (sampled)"));
  }
  if (r.nan_sample_period() > kMaxNanSamplePeriod) {
    return absl::InvalidArgumentError(absl::StrCat("nan sample period ", r.nan_sample_period(),
                                                   "; allowed 0 (the daemon's) or 1 to ",
                                                   kMaxNanSamplePeriod));
  }
  if (r.nan_policy() < v1::NAN_POLICY_UNSPECIFIED || r.nan_policy() > v1::NAN_POLICY_FAIL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nan policy ", r.nan_policy(), "; allowed 0 (the daemon's), 1 (report), 2 (fail)"));
  }
  if (r.timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms ", r.timeout_ms(), "; allowed 0 (default) or more"));
  }
  return absl::OkStatus();
}

}  // namespace

GroupRegistry::GroupRegistry(GroupsOptions options, memory::AllocationTable* table,
                             server::TimerQueue* timers, prometheus::Registry* registry)
    : options_(options), table_(table), timers_(timers) {
  groups_gauge_ = &prometheus::BuildGauge()
                       .Name("commd_groups")
                       .Help("Groups forming or active")
                       .Register(*registry)
                       .Add({});
  prometheus::Histogram::BucketBoundaries buckets;
  for (double v = 1e-4; v < 1000; v *= 4) buckets.push_back(v);
  rendezvous_seconds_ = &prometheus::BuildHistogram()
                             .Name("commd_rendezvous_duration_seconds")
                             .Help("From the first rank's join to the group forming")
                             .Register(*registry)
                             .Add({}, buckets);
}

GroupRegistry::~GroupRegistry() = default;

size_t GroupRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return by_name_.size();
}

void GroupRegistry::UpdateMetrics() { groups_gauge_->Set(static_cast<double>(by_name_.size())); }

absl::StatusOr<std::shared_ptr<GroupRegistry::Group>> GroupRegistry::FindOrCreate(
    const server::Session& session, const v1::JoinGroupRequest& request, absl::Duration timeout) {
  const Key key{session.uid, session.job_id, request.name()};
  if (auto it = by_name_.find(key); it != by_name_.end()) return groups_.at(it->second);
  if (by_name_.size() >= options_.max_groups) {
    return absl::ResourceExhaustedError(
        absl::StrCat("group limit reached: ", by_name_.size(), " groups (limits.max_groups)"));
  }
  // Each uid's share of the rendezvous slots, so that one user's never-completed groups
  // cannot fill max_groups for everyone.
  if (forming_.of(session.uid) >= options_.max_groups_forming_per_uid) {
    return UidShareExhausted(session.uid, forming_.of(session.uid),
                             options_.max_groups_forming_per_uid, "groups in rendezvous",
                             "groups_forming");
  }
  forming_.Add(session.uid, 1);
  auto group = std::make_shared<Group>();
  group->id = next_id_++;
  group->key = key;
  group->world_size = request.world_size();
  group->members.resize(request.world_size());
  group->asks_made.resize(request.world_size());
  group->created = absl::Now();
  group->timeout = timeout;
  group->policy = request.watchdog_policy();
  group->collectives = EffectiveSettings(options_.collectives, request);
  const uint64_t id = group->id;
  group->timer = timers_->Schedule(group->created + timeout, [this, id] { OnJoinTimeout(id); });
  groups_[id] = group;
  by_name_[key] = id;
  UpdateMetrics();
  return group;
}

absl::StatusOr<int> GroupRegistry::AddMember(Group& group,
                                             std::shared_ptr<const server::Session> session,
                                             const v1::JoinGroupRequest& request) {
  const int rank = request.rank();
  if (request.world_size() != group.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", request.world_size(), " disagrees with group ", group.name(),
                     "'s world size ", group.world_size, " (set by the first rank to join)"));
  }
  Member& m = group.members[rank];
  if (group.active) {
    return m.gone ? absl::FailedPreconditionError(absl::StrCat(
                        "group ", group.name(), " is active and its rank ", rank,
                        " has left; every rank must leave before the group can form again"))
                  : absl::AlreadyExistsError(absl::StrCat("group ", group.name(),
                                                          " has already formed (world size ",
                                                          group.world_size, ")"));
  }
  if (m.joined) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " already joined group ",
                                                 group.name(), " (pid ", m.session->pid, ")"));
  }
  ASSIGN_OR_RETURN(m.device, table_->ResolveDevice(request.device(), request.device_uuid()));
  m.joined = true;
  m.session = std::move(session);
  m.global_rank = request.global_rank() < 0 ? rank : request.global_rank();
  ++group.joined;
  return rank;
}

void GroupRegistry::Join(std::shared_ptr<const server::Session> session,
                         const v1::JoinGroupRequest& request, v1::JoinGroupResponse* response,
                         std::shared_ptr<server::PendingCall> call) {
  if (absl::Status s = ValidateJoin(request); !s.ok()) return call->Finish(s);
  const absl::Duration timeout = request.timeout_ms() == 0
                                     ? options_.default_timeout
                                     : absl::Milliseconds(request.timeout_ms());
  if (timeout > options_.max_timeout) {
    return call->Finish(absl::InvalidArgumentError(
        absl::StrCat("timeout of ", absl::FormatDuration(timeout), "; allowed up to ",
                     absl::FormatDuration(options_.max_timeout), " (groups.max_timeout_ms)")));
  }
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto group = FindOrCreate(*session, request, timeout);
    if (!group.ok()) return call->Finish(group.status());
    auto rank = AddMember(**group, session, request);
    if (!rank.ok()) return call->Finish(rank.status());
    Member& m = (*group)->members[*rank];
    m.pending = call;
    m.response = response;
    const uint64_t id = (*group)->id;
    const int r = *rank;
    // A join call that dies (its process exited, or it gave up) means this rank will not be
    // in the group. The session's end, which follows within moments when the process died,
    // says which; this timer covers a rank that only dropped its call.
    call->OnCancel([this, id, r, token = session->token] {
      timers_->Schedule(absl::Now() + kCancelSettleTime,
                        [this, id, r, token] { LeaveRendezvous(id, r, token); });
    });
    if ((*group)->joined == (*group)->world_size) Form(**group, deferred);
  }
  for (auto& f : deferred) f();
}

absl::Status GroupRegistry::CreateControlBlock(const Group& group, int rank, Member& m) {
  const size_t bytes = ControlBlockBytes(options_.ring_capacity);
  ASSIGN_OR_RETURN(m.control_block,
                   table_->Allocate({m.session->uid, m.session->job_id, m.session->token},
                                    memory::Device::Host(), bytes,
                                    absl::StrCat(group.job(), "/", group.name(), "/cb", rank),
                                    v1::SESSION, memory::Purpose::kControlBlock));
  ASSIGN_OR_RETURN(SharedMapping map, SharedMapping::Map(m.control_block->block.fd.get(), bytes));
  m.control_map = std::make_shared<SharedMapping>(std::move(map));
  // A fresh memfd reads as zeros: writing only the header keeps the rest of the block (the
  // ring, ~3.4 MiB at 4096 entries) out of the daemon's RSS until the rank fills it.
  return InitControlBlock(m.control_map->data(), bytes,
                          {.ring_capacity = options_.ring_capacity,
                           .rank = rank,
                           .world_size = group.world_size,
                           .global_rank = m.global_rank,
                           .memory_is_zero = true});
}

void GroupRegistry::Form(Group& group, Deferred& deferred) {
  timers_->Cancel(group.timer);
  absl::Status status;
  for (int r = 0; r < group.world_size && status.ok(); ++r) {
    status = CreateControlBlock(group, r, group.members[r]);
  }
  if (!status.ok()) return FailRendezvous(group, status, deferred);
  group.active = true;
  forming_.Sub(std::get<0>(group.key), 1);
  rendezvous_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - group.created));
  for (int r = 0; r < group.world_size; ++r) {
    Member& m = group.members[r];
    v1::JoinGroupResponse* out = m.response;
    out->set_group_id(group.id);
    out->set_name(group.name());
    out->set_rank(r);
    out->set_world_size(group.world_size);
    *out->mutable_collectives() = group.collectives;
    for (const Member& peer : group.members) {
      v1::Member* pm = out->add_members();
      pm->set_rank(static_cast<int>(&peer - group.members.data()));
      pm->set_global_rank(peer.global_rank);
      pm->set_pid(peer.session->pid);
      pm->set_device(peer.device.ToString());
    }
    auto handle = table_->Handle(*m.control_block, m.session->pid, r);
    absl::Status s = handle.status();
    if (handle.ok()) *out->mutable_control_block() = *std::move(handle);
    deferred.push_back([call = std::move(m.pending), s] { call->Finish(s); });
    m.response = nullptr;
  }
  COMMD_LOG(INFO, "groups") << "group " << group.job() << "/" << group.name()
                            << " formed: " << group.world_size << " rank(s)";
}

void GroupRegistry::FailRendezvous(Group& group, const absl::Status& status, Deferred& deferred) {
  std::vector<uint64_t> blocks;
  for (Member& m : group.members) {
    if (m.pending)
      deferred.push_back([call = std::move(m.pending), status] { call->Finish(status); });
    if (m.control_block) blocks.push_back(m.control_block->id);
  }
  COMMD_LOG(WARNING, "groups") << "group " << group.job() << "/" << group.name()
                               << " did not form: " << status.message();
  ReleaseLater(std::move(blocks), deferred);
  timers_->Cancel(group.timer);
  forming_.Sub(std::get<0>(group.key), 1);  // only forming groups fail their rendezvous
  by_name_.erase(group.key);
  groups_.erase(group.id);
  UpdateMetrics();
}

void GroupRegistry::OnJoinTimeout(uint64_t group_id) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_id);
    if (it == groups_.end() || it->second->active) return;
    const std::shared_ptr<Group> keep = it->second;  // FailRendezvous drops the map's reference
    Group& g = *keep;
    std::vector<int> missing, present;
    for (int r = 0; r < g.world_size; ++r) (g.members[r].joined ? present : missing).push_back(r);
    if (options_.on_rendezvous_timeout) {
      deferred.push_back([hook = options_.on_rendezvous_timeout, w = WatchedOf(g), present,
                          missing] { hook(w, present, missing); });
    }
    FailRendezvous(g,
                   absl::DeadlineExceededError(absl::StrCat(
                       "group ", g.name(), ": rank(s) ", RankList(missing), " never joined within ",
                       absl::FormatDuration(g.timeout), " (world size ", g.world_size,
                       "; joined: ", RankList(present), ")")),
                   deferred);
  }
  for (auto& f : deferred) f();
}

void GroupRegistry::LeaveRendezvous(uint64_t group_id, int rank, const std::string& token) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_id);
    if (it == groups_.end() || it->second->active) return;
    const std::shared_ptr<Group> keep = it->second;
    const Member& m = keep->members[rank];
    if (!m.joined || m.session->token != token) return;
    FailRendezvous(
        *keep,
        absl::AbortedError(absl::StrCat("rank ", rank, " (pid ", m.session->pid, ") of group ",
                                        keep->name(), " abandoned its join during rendezvous")),
        deferred);
  }
  for (auto& f : deferred) f();
}

GroupRegistry::Group* GroupRegistry::FindForMember(const server::Session& session,
                                                   uint64_t group_id, int* rank) {
  auto it = groups_.find(group_id);
  if (it == groups_.end() || it->second->retired) return nullptr;
  Group& g = *it->second;
  for (int r = 0; r < g.world_size; ++r) {
    const Member& m = g.members[r];
    if (m.joined && !m.gone && m.session->token == session.token) {
      *rank = r;
      return &g;
    }
  }
  return nullptr;
}

void GroupRegistry::AllocateSymmetric(std::shared_ptr<const server::Session> session,
                                      const v1::AllocateSymmetricRequest& request,
                                      v1::SymmetricAllocation* response,
                                      std::shared_ptr<server::PendingCall> call) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    int rank = -1;
    Group* g = FindForMember(*session, request.group_id(), &rank);
    if (g == nullptr || !g->active) {
      return call->Finish(absl::NotFoundError(absl::StrCat(
          "no formed group with id ", request.group_id(), " that this session is a member of")));
    }
    for (int r = 0; r < g->world_size; ++r) {
      if (g->members[r].gone) {
        return call->Finish(absl::AbortedError(
            absl::StrCat("rank ", r, " (pid ", g->members[r].session->pid, ") of group ", g->name(),
                         " has left; the group can make no new symmetric allocation")));
      }
    }
    if (request.bytes() == 0 || request.bytes() > (uint64_t{1} << 62)) {
      return call->Finish(absl::InvalidArgumentError(
          absl::StrCat("symmetric allocation of ", request.bytes(), " bytes in group ", g->name(),
                       "; allowed 1 byte to limits.max_allocation_bytes")));
    }
    const uint64_t index = g->asks_made[rank]++;
    // Failed rounds are kept only until every rank has moved past them.
    const uint64_t oldest = *std::min_element(g->asks_made.begin(), g->asks_made.end());
    g->rounds.erase(g->rounds.begin(), g->rounds.lower_bound(std::min(oldest, index)));
    Round& round = g->rounds[index];
    if (round.failed) return call->Finish(*round.failed);
    round.asks[rank] = Round::Ask{request.bytes(), call, response};
    const uint64_t id = g->id;
    call->OnCancel([this, id, index, rank, name = g->name()] {
      Deferred later;
      {
        absl::MutexLock l(&mu_);
        auto it = groups_.find(id);
        if (it == groups_.end()) return;
        FailRound(*it->second, index,
                  absl::AbortedError(absl::StrCat("rank ", rank, " of group ", name,
                                                  " cancelled its AllocateSymmetric")),
                  later);
      }
      for (auto& f : later) f();
    });
    if (round.asks.size() == 1) {
      const absl::Duration timeout =
          request.timeout_ms() > 0
              ? std::min(absl::Milliseconds(request.timeout_ms()), options_.max_timeout)
              : g->timeout;
      round.timer = timers_->Schedule(absl::Now() + timeout,
                                      [this, id, index] { OnRoundTimeout(id, index); });
    }
    if (static_cast<int>(round.asks.size()) == g->world_size) CompleteRound(*g, index, deferred);
  }
  for (auto& f : deferred) f();
}

void GroupRegistry::CompleteRound(Group& g, uint64_t index, Deferred& deferred) {
  Round& round = g.rounds[index];
  timers_->Cancel(round.timer);
  const uint64_t bytes = round.asks.begin()->second.bytes;
  for (const auto& [rank, ask] : round.asks) {
    if (ask.bytes != bytes) {
      std::vector<std::string> sizes;
      for (const auto& [r, a] : round.asks)
        sizes.push_back(absl::StrCat("rank ", r, ": ", a.bytes));
      return FailRound(g, index,
                       absl::InvalidArgumentError(absl::StrCat(
                           "AllocateSymmetric sizes differ across group ", g.name(), " (",
                           absl::StrJoin(sizes, ", "), "); every rank must ask the same size")),
                       deferred);
    }
  }
  const size_t offset = SymmetricDataOffset(g.world_size);
  SymmetricBuffers buffers;
  for (int r = 0; r < g.world_size; ++r) {
    const Member& m = g.members[r];
    auto block = table_->Allocate(
        {m.session->uid, m.session->job_id, m.session->token}, m.device, offset + bytes,
        absl::StrCat(g.job(), "/", g.name(), "/sym", index, "/r", r), v1::SESSION);
    if (!block.ok()) {
      std::vector<uint64_t> ids;
      for (const auto& b : buffers.buffers) ids.push_back(b->id);
      ReleaseLater(std::move(ids), deferred);
      return FailRound(g, index, block.status(), deferred);
    }
    buffers.buffers.push_back(*std::move(block));
  }
  buffers.released.assign(g.world_size, false);
  const uint64_t allocation_id = buffers.buffers[0]->id;
  for (auto& [rank, ask] : round.asks) {
    v1::SymmetricAllocation* out = ask.response;
    out->set_allocation_id(allocation_id);
    out->set_bytes(bytes);
    out->set_signal_pad_bytes(SignalPadBytes(g.world_size));
    out->set_data_offset(offset);
    absl::Status status;
    for (int q = 0; q < g.world_size && status.ok(); ++q) {
      auto handle = table_->Handle(*buffers.buffers[q], g.members[rank].session->pid, q);
      status = handle.status();
      if (handle.ok()) *out->add_buffers() = *std::move(handle);
    }
    deferred.push_back([call = std::move(ask.call), status] { call->Finish(status); });
  }
  g.allocations[allocation_id] = std::move(buffers);
  g.rounds.erase(index);  // every rank has asked: nobody will look this round up again
}

void GroupRegistry::FailRound(Group& g, uint64_t index, const absl::Status& status,
                              Deferred& deferred) {
  auto it = g.rounds.find(index);
  if (it == g.rounds.end() || it->second.failed) return;
  Round& round = it->second;
  timers_->Cancel(round.timer);
  round.failed = status;
  for (auto& [rank, ask] : round.asks) {
    deferred.push_back([call = std::move(ask.call), status] { call->Finish(status); });
  }
  round.asks.clear();
}

void GroupRegistry::OnRoundTimeout(uint64_t group_id, uint64_t index) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_id);
    if (it == groups_.end()) return;
    Group& g = *it->second;
    auto round = g.rounds.find(index);
    if (round == g.rounds.end() || round->second.failed) return;
    std::vector<int> missing;
    for (int r = 0; r < g.world_size; ++r) {
      if (!round->second.asks.contains(r)) missing.push_back(r);
    }
    FailRound(g, index,
              absl::DeadlineExceededError(absl::StrCat(
                  "group ", g.name(), ": rank(s) ", RankList(missing),
                  " never called AllocateSymmetric (allocation #", index, ") in time")),
              deferred);
  }
  for (auto& f : deferred) f();
}

absl::Status GroupRegistry::ReleaseSymmetric(const server::Session& session,
                                             const v1::ReleaseSymmetricRequest& request) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    int rank = -1;
    Group* g = FindForMember(session, request.group_id(), &rank);
    auto it = g == nullptr ? decltype(g->allocations)::iterator()
                           : g->allocations.find(request.allocation_id());
    if (g == nullptr || it == g->allocations.end()) {
      return absl::NotFoundError(absl::StrCat("no symmetric allocation ", request.allocation_id(),
                                              " in group ", request.group_id()));
    }
    it->second.released[rank] = true;
    bool all = true;
    for (int r = 0; r < g->world_size; ++r) {
      all = all && (it->second.released[r] || g->members[r].gone);
    }
    if (all) {
      for (const auto& b : it->second.buffers) {
        deferred.push_back([this, id = b->id] { table_->Release(id); });
      }
      g->allocations.erase(it);
    }
  }
  for (auto& f : deferred) f();
  return absl::OkStatus();
}

void GroupRegistry::ReleaseLater(std::vector<uint64_t> ids, Deferred& deferred) {
  if (ids.empty()) return;
  auto release = [this, ids] {
    for (uint64_t id : ids) table_->Release(id);
  };
  if (options_.release_grace <= absl::ZeroDuration()) {
    deferred.push_back(std::move(release));
  } else {
    timers_->Schedule(absl::Now() + options_.release_grace, std::move(release));
  }
}

std::vector<recorder::DumpSource> GroupRegistry::SourcesOf(const Group& g) const {
  std::vector<int> global_ranks;
  for (const Member& m : g.members) global_ranks.push_back(m.global_rank);
  std::vector<recorder::DumpSource> out;
  for (int r = 0; r < g.world_size; ++r) {
    const Member& m = g.members[r];
    if (m.control_map == nullptr) continue;
    out.push_back({.job_id = g.job(),
                   .uid = std::get<0>(g.key),
                   .group = g.name(),
                   .group_id = g.id,
                   .rank = r,
                   .global_rank = m.global_rank,
                   .world_size = g.world_size,
                   .pid = m.session->pid,
                   .device = m.device.ToString(),
                   .group_global_ranks = global_ranks,
                   .block = m.control_map});
  }
  return out;
}

std::vector<recorder::DumpSource> GroupRegistry::DumpSources(const DumpFilter& filter) const {
  absl::MutexLock lock(&mu_);
  std::vector<recorder::DumpSource> out;
  for (const auto& [id, g] : groups_) {
    if (!g->active) continue;
    if (filter.job &&
        (std::get<0>(g->key) != filter.job->first || g->job() != filter.job->second)) {
      continue;
    }
    if (!filter.group.empty() && g->name() != filter.group) continue;
    for (auto& source : SourcesOf(*g)) out.push_back(std::move(source));
  }
  return out;
}

void GroupRegistry::MemberGone(Group& g, int rank, const server::SessionEnd& end,
                               Deferred& deferred) {
  Member& m = g.members[rank];
  m.gone = true;
  m.died = end.process_exited();
  const std::string text = DepartureText(rank, m.session->pid, end);
  if (m.died && options_.on_rank_death) {
    // The dead rank's last entries, and its peers' view of the same moment.
    deferred.push_back(
        [hook = options_.on_rank_death,
         death = RankDeath{
             .group = WatchedOf(g), .rank = rank, .text = text, .sources = SourcesOf(g)}] {
          hook(death);
        });
  }
  const absl::Status status = absl::AbortedError(absl::StrCat(text, " (group ", g.name(), ")"));
  // Nobody can complete an allocation this rank will never ask for.
  for (auto& [index, round] : g.rounds) FailRound(g, index, status, deferred);
  std::vector<uint64_t> ids;
  if (m.control_block) ids.push_back(m.control_block->id);
  for (auto it = g.allocations.begin(); it != g.allocations.end();) {
    ids.push_back(it->second.buffers[rank]->id);
    it->second.released[rank] = true;
    ++it;
  }
  ReleaseLater(std::move(ids), deferred);
  bool all_gone = true;
  for (const Member& other : g.members) all_gone = all_gone && other.gone;
  if (all_gone) Retire(g, deferred);
}

void GroupRegistry::Retire(Group& g, Deferred& deferred) {
  g.retired = true;
  by_name_.erase(g.key);
  groups_.erase(g.id);  // buffers are freed by the ReleaseLater timers already scheduled
  UpdateMetrics();
}

void GroupRegistry::OnSessionEnd(const server::Session& session, const server::SessionEnd& end) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<Group>> groups;
    for (const auto& [id, g] : groups_) groups.push_back(g);
    for (const auto& g : groups) {
      for (int r = 0; r < g->world_size; ++r) {
        Member& m = g->members[r];
        if (!m.joined || m.gone || m.session->token != session.token) continue;
        if (g->active) {
          MemberGone(*g, r, end, deferred);
        } else {
          // Its JoinGroup died with the session: the group can no longer form as asked.
          FailRendezvous(
              *g,
              absl::AbortedError(absl::StrCat(DepartureText(r, session.pid, end),
                                              " during the rendezvous of group ", g->name())),
              deferred);
          break;
        }
      }
    }
  }
  for (auto& f : deferred) f();
}

WatchedGroup GroupRegistry::WatchedOf(const Group& g) const {
  WatchedGroup w;
  w.id = g.id;
  w.uid = std::get<0>(g.key);
  w.job_id = g.job();
  w.name = g.name();
  w.world_size = g.world_size;
  w.active = g.active;
  w.created = g.created;
  w.timeout = g.timeout;
  w.policy = g.policy;
  for (int r = 0; r < g.world_size; ++r) {
    const Member& m = g.members[r];
    WatchedMember wm;
    wm.rank = r;
    wm.global_rank = m.global_rank;
    if (m.session != nullptr) {
      wm.pid = m.session->pid;
      wm.session_token = m.session->token;
    }
    wm.gone = m.gone;
    wm.died = m.died;
    wm.block = m.control_map;
    w.members.push_back(std::move(wm));
  }
  return w;
}

std::vector<WatchedGroup> GroupRegistry::Watch() const {
  absl::MutexLock lock(&mu_);
  std::vector<WatchedGroup> out;
  out.reserve(groups_.size());
  for (const auto& [id, g] : groups_) out.push_back(WatchedOf(*g));
  return out;
}

std::vector<v1::GroupInfo> GroupRegistry::List(const server::Session& session) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::GroupInfo> out;
  for (const auto& [key, id] : by_name_) {
    const Group& g = *groups_.at(id);
    if (!session.admin && (std::get<0>(key) != session.uid || g.job() != session.job_id)) continue;
    v1::GroupInfo info;
    info.set_job_id(g.job());
    info.set_uid(std::get<0>(key));
    info.set_name(g.name());
    info.set_world_size(g.world_size);
    info.set_joined(g.joined);
    info.set_state(g.active ? "active" : "rendezvous");
    uint64_t bytes = 0;
    for (int r = 0; r < g.world_size; ++r) {
      const Member& m = g.members[r];
      if (!m.joined) continue;
      v1::Member* pm = info.add_members();
      pm->set_rank(r);
      pm->set_global_rank(m.global_rank);
      pm->set_pid(m.session->pid);
      pm->set_device(m.device.ToString());
      if (m.control_block) bytes += m.control_block->block.bytes;
    }
    for (const auto& [aid, a] : g.allocations) {
      for (const auto& b : a.buffers) bytes += b->block.bytes;
    }
    info.set_memory_bytes(bytes);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace commd::groups
