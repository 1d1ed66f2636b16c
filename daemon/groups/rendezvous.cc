// The rendezvous of GroupRegistry: ranks join a group by name until all world_size have, then
// each gets its control block and the group's members; a deadline, a dropped join or a dead
// process fails every waiting rank instead.
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/control_block_admin.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "daemon/groups/group_registry.h"

namespace commd::groups {

namespace {

// How long a cancelled join waits for its session's end to say why it was cancelled.
constexpr absl::Duration kCancelSettleTime = absl::Milliseconds(300);

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
  // Before anything is kept per global rank: a hostile size costs nothing.
  if (const int g = r.global_world_size();
      g < 0 || g > kMaxGlobalWorldSize || (g > 0 && g < r.world_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global world size ", g, " for group ", r.name(), " of world size ", r.world_size(),
        " on this node; allowed 0 (the group is on this node only) or ", r.world_size(), " to ",
        kMaxGlobalWorldSize, " (a group spanning nodes)"));
  }
  if (const int g = r.global_world_size();
      g > r.world_size() && (r.global_rank() < 0 || r.global_rank() >= g)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global rank ", r.global_rank(), " for group ", r.name(), " of global world size ", g,
        "; allowed 0 to ", g - 1, " (a group spanning nodes needs each rank's global rank)"));
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
  // The config's collectives.nan_sample_period has the same range (config_test.cc).
  if (r.nan_sample_period() != 0 && (r.nan_sample_period() < kMinNanSamplePeriod ||
                                     r.nan_sample_period() > kMaxNanSamplePeriod)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nan sample period ", r.nan_sample_period(), "; allowed 0 (the daemon's) or ",
                     kMinNanSamplePeriod, " to ", kMaxNanSamplePeriod));
  }
  if (r.nan_policy() < v1::NAN_POLICY_UNSPECIFIED || r.nan_policy() > v1::NAN_POLICY_FAIL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nan policy ", r.nan_policy(), "; allowed 0 (the daemon's), 1 (report), 2 (fail)"));
  }
  RETURN_IF_ERROR(ValidateDescription(r.description()));
  if (r.timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms ", r.timeout_ms(), "; allowed 0 (default) or more"));
  }
  return absl::OkStatus();
}

// The group's size over its nodes as the group keeps it: 0 for a node-local group.
int SpanningSize(const v1::JoinGroupRequest& r) {
  return r.global_world_size() > r.world_size() ? r.global_world_size() : 0;
}

// Takes `rank` of `group` for the session, or says why it cannot.
absl::StatusOr<int> AddMember(const memory::AllocationTable& memory, Group& group,
                              std::shared_ptr<const server::Session> session,
                              const v1::JoinGroupRequest& request) {
  const int rank = request.rank();
  if (request.world_size() != group.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", request.world_size(), " disagrees with group ", group.name(),
                     "'s world size ", group.world_size, " (set by the first rank to join)"));
  }
  if (SpanningSize(request) != group.global_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("global world size ", request.global_world_size(), " disagrees with group ",
                     group.name(), "'s global world size ", group.global_world_size,
                     " (set by the first rank to join; 0 for a group on this node only)"));
  }
  if (const std::string d = DescriptionOf(request); d != group.description) {
    // Both are bounded (the join validated them), so both are quoted whole.
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " gives group ", group.name(), " the description ",
                     QuoteForError(d), " but the group's is ", QuoteForError(group.description),
                     " (set by the first rank to join); every rank must give the same"));
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
  for (int q = 0; group.spanning() && q < group.world_size; ++q) {
    const Member& other = group.members[q];
    if (other.joined && other.global_rank == request.global_rank()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " claims global rank ", request.global_rank(), " of group ",
                       group.name(), ", which rank ", q, " (pid ", other.session->pid,
                       ") has; each global rank is one rank's"));
    }
  }
  ASSIGN_OR_RETURN(m.device, memory.ResolveDevice(request.device(), request.device_uuid()));
  m.joined = true;
  m.session = std::move(session);
  m.global_rank = request.global_rank() < 0 ? rank : request.global_rank();
  ++group.joined;
  return rank;
}

// What rank `r` learns when the group forms (all but its control block's handle).
void FillJoinResponse(const Group& group, int r, v1::JoinGroupResponse* out) {
  out->set_group_id(group.id);
  out->set_name(group.name());
  out->set_rank(r);
  out->set_world_size(group.world_size);
  *out->mutable_collectives() = group.collectives;
  out->set_description(group.description);
  out->set_global_world_size(group.spanning() ? group.global_world_size : group.world_size);
  if (group.spanning()) *out->mutable_layout() = group.layout;
  for (int q = 0; q < group.world_size; ++q) {
    const Member& peer = group.members[q];
    v1::Member* pm = out->add_members();
    pm->set_rank(q);
    pm->set_global_rank(peer.global_rank);
    pm->set_pid(peer.session->pid);
    pm->set_device(peer.device.ToString());
  }
}

}  // namespace

absl::Status ValidateDescription(absl::string_view d) {
  if (d.size() > kMaxGroupDescriptionBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group description ", QuoteForError(d), " is longer than ", kMaxGroupDescriptionBytes,
        " bytes (the flight recorder's process-group desc); allowed 0 to ",
        kMaxGroupDescriptionBytes, " bytes of printable ASCII"));
  }
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0x20 || d[i] > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("group description ", QuoteForError(d), " has the byte '",
                       absl::CEscape(d.substr(i, 1)), "' at ", i, "; allowed printable ASCII"));
    }
  }
  return absl::OkStatus();
}

std::string DescriptionOf(const v1::JoinGroupRequest& request) {
  return request.description().empty() ? kDefaultGroupDescription : request.description();
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

std::string DepartureText(int rank, int64_t pid, const server::SessionEnd& end,
                          const Group* spanning) {
  std::string who = absl::StrCat("rank ", rank, " (pid ", pid, ")");
  if (spanning != nullptr && spanning->spanning()) {
    // The other nodes know the rank by its global rank and this node's name.
    const v1::GroupLayout& l = spanning->layout;
    who = absl::StrCat("global rank ", spanning->members[rank].global_rank,
                       l.this_node() >= 0 && l.this_node() < l.nodes_size()
                           ? absl::StrCat(" on node ", l.nodes(l.this_node()).node())
                           : "",
                       " (local rank ", rank, ", pid ", pid, ")");
  }
  if (!end.process_exited()) return absl::StrCat(who, " closed its session");
  const std::string how = end.exit.ToString();
  return absl::StartsWith(how, "exited") ? absl::StrCat(who, " ", how)
                                         : absl::StrCat(who, " exited: ", how);
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
    if (SpanningSize(request) > 0) {
      if (span_ == nullptr) {
        return call->Finish(absl::FailedPreconditionError(absl::StrCat(
            "group ", request.name(), " spans nodes (global world size ",
            request.global_world_size(), " > its world size ", request.world_size(),
            " on this node), which needs a cluster; this daemon has none (add a cluster "
            "section naming etcd: docs/cluster.md)")));
      }
      if (absl::Status s = span_->Admit(); !s.ok()) return call->Finish(s);
    }
    bool created = false;
    auto group = table_.FindOrCreate(*session, request, timeout, &created);
    if (!group.ok()) return call->Finish(group.status());
    Group& g = **group;
    const uint64_t id = g.id;
    if (created) {
      g.collectives = EffectiveSettings(options_.collectives, request);
      g.timer = timers_->Schedule(g.created + timeout, [this, id] { OnJoinTimeout(id); });
    }
    auto rank = AddMember(*memory_, g, session, request);
    if (!rank.ok()) {
      if (created) Changed();
      return call->Finish(rank.status());
    }
    Member& m = g.members[*rank];
    m.pending = call;
    m.response = response;
    const int r = *rank;
    // A join call that dies (its process exited, or it gave up) means this rank will not be
    // in the group. The session's end, which follows within moments when the process died,
    // says which; this timer covers a rank that only dropped its call.
    call->OnCancel([this, id, r, token = session->token] {
      timers_->Schedule(absl::Now() + kCancelSettleTime,
                        [this, id, r, token] { LeaveRendezvous(id, r, token); });
    });
    if (g.joined == g.world_size) g.spanning() ? StartSpan(g, deferred) : Form(g, deferred);
    Changed();
  }
  for (auto& f : deferred) f();
}

absl::Status GroupRegistry::CreateControlBlock(const Group& group, int rank, Member& m) {
  const size_t bytes = ControlBlockBytes(options_.ring_capacity);
  ASSIGN_OR_RETURN(m.control_block,
                   memory_->Allocate({m.session->uid, m.session->job_id, m.session->token},
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
  table_.Formed(group);
  rendezvous_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - group.created));
  for (int r = 0; r < group.world_size; ++r) {
    Member& m = group.members[r];
    FillJoinResponse(group, r, m.response);
    auto handle = memory_->Handle(*m.control_block, m.session->pid, r);
    absl::Status s = handle.status();
    if (handle.ok()) *m.response->mutable_control_block() = *std::move(handle);
    deferred.push_back([call = std::move(m.pending), s] { call->Finish(s); });
    m.response = nullptr;
  }
  COMMD_LOG(INFO, "groups") << "group " << group.job() << "/" << group.name()
                            << " formed: " << group.world_size << " rank(s)";
}

void GroupRegistry::StartSpan(Group& group, Deferred& deferred) {
  SpanPart part{.uid = group.uid(),
                .job = group.job(),
                .group = group.name(),
                .global_world_size = group.global_world_size};
  for (const Member& m : group.members) part.global_ranks.push_back(m.global_rank);
  const uint64_t id = group.id;
  // A group id names one incarnation of one group, and it waits on the nodes once: the id is
  // enough to tell whether the answer is still wanted. The answer hops to the timer thread
  // because it may come inside Start, under this lock.
  auto wait = span_->Start(std::move(part), [this, id](absl::StatusOr<v1::GroupLayout> layout) {
    timers_->Schedule(absl::Now(), [this, id, layout = std::move(layout)]() mutable {
      OnSpanDone(id, std::move(layout));
    });
  });
  if (!wait.ok()) return FailRendezvous(group, wait.status(), deferred);
  group.span = *std::move(wait);
}

void GroupRegistry::OnSpanDone(uint64_t group_id, absl::StatusOr<v1::GroupLayout> layout) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const std::shared_ptr<Group> keep = table_.Find(group_id);
    if (keep == nullptr || keep->active || keep->span == nullptr) return;
    if (layout.ok()) {
      keep->layout = *std::move(layout);
      Form(*keep, deferred);
    } else {
      FailRendezvous(*keep, layout.status(), deferred);
    }
    Changed();
  }
  for (auto& f : deferred) f();
}

void GroupRegistry::FailRendezvous(Group& group, const absl::Status& status, Deferred& deferred) {
  // Nothing of a failed join stays in the cluster.
  if (group.span != nullptr) std::exchange(group.span, nullptr)->Withdraw();
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
  table_.Remove(group);
}

void GroupRegistry::OnJoinTimeout(uint64_t group_id) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const std::shared_ptr<Group> keep = table_.Find(group_id);  // Remove drops the table's
    if (keep == nullptr || keep->active) return;
    Group& g = *keep;
    if (g.span != nullptr) {  // every local rank is in; some node is not
      FailRendezvous(g,
                     absl::DeadlineExceededError(
                         absl::StrCat("group ", g.name(), " spans nodes and did not form within ",
                                      absl::FormatDuration(g.timeout), ": ", g.span->Missing(),
                                      " (global world size ", g.global_world_size, ")")),
                     deferred);
    } else {
      FailLocalRendezvous(g, deferred);
    }
    Changed();
  }
  for (auto& f : deferred) f();
}

void GroupRegistry::FailLocalRendezvous(Group& g, Deferred& deferred) {
  std::vector<int> missing, present;
  for (int r = 0; r < g.world_size; ++r) (g.members[r].joined ? present : missing).push_back(r);
  if (options_.on_rendezvous_timeout) {
    deferred.push_back([hook = options_.on_rendezvous_timeout, w = SnapshotOf(g), present,
                        missing] { hook(w, present, missing); });
  }
  FailRendezvous(g,
                 absl::DeadlineExceededError(absl::StrCat(
                     "group ", g.name(), ": rank(s) ", RankList(missing), " never joined within ",
                     absl::FormatDuration(g.timeout), " (world size ", g.world_size,
                     "; joined: ", RankList(present), ")")),
                 deferred);
}

void GroupRegistry::LeaveRendezvous(uint64_t group_id, int rank, const std::string& token) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const std::shared_ptr<Group> keep = table_.Find(group_id);
    if (keep == nullptr || keep->active) return;
    const Member& m = keep->members[rank];
    if (!m.joined || m.session->token != token) return;
    FailRendezvous(
        *keep,
        absl::AbortedError(absl::StrCat("rank ", rank, " (pid ", m.session->pid, ") of group ",
                                        keep->name(), " abandoned its join during rendezvous")),
        deferred);
    Changed();
  }
  for (auto& f : deferred) f();
}

}  // namespace commd::groups
