// The symmetric-allocation rounds of GroupRegistry: the n-th AllocateSymmetric of every rank
// of a formed group makes one round; when all have asked (the same size) each rank gets a
// buffer and a handle to every peer's. A deadline, a cancelled ask or a departed rank fails
// the round for every rank in it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/symmetric_layout.h"
#include "daemon/groups/group_registry.h"

namespace commd::groups {

namespace {

// The round's common size, or INVALID_ARGUMENT listing what each rank asked (the size and, when
// they differ, whether host memory).
absl::StatusOr<uint64_t> CommonSize(const Group& g, const Round& round) {
  const uint64_t bytes = round.asks.begin()->second.bytes;
  const bool host = round.asks.begin()->second.host_memory;
  for (const auto& [rank, ask] : round.asks) {
    if (ask.host_memory != host) {
      std::vector<std::string> kinds;
      for (const auto& [r, a] : round.asks) {
        kinds.push_back(
            absl::StrCat("rank ", r, ": ", a.host_memory ? "host" : "the group's device"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "AllocateSymmetric memory differs across group ", g.name(), " (",
          absl::StrJoin(kinds, ", "), "); every rank must ask the same (host_memory)"));
    }
    if (ask.bytes == bytes) continue;
    std::vector<std::string> sizes;
    for (const auto& [r, a] : round.asks) sizes.push_back(absl::StrCat("rank ", r, ": ", a.bytes));
    return absl::InvalidArgumentError(absl::StrCat("AllocateSymmetric sizes differ across group ",
                                                   g.name(), " (", absl::StrJoin(sizes, ", "),
                                                   "); every rank must ask the same size"));
  }
  return bytes;
}

// Why a member's ask cannot start a round now, if it cannot.
absl::Status CheckAsk(const Group* g, const v1::AllocateSymmetricRequest& request) {
  if (g == nullptr || !g->active) {
    return absl::NotFoundError(absl::StrCat("no formed group with id ", request.group_id(),
                                            " that this session is a member of"));
  }
  if (g->aborted) return *g->aborted;
  for (int r = 0; r < g->world_size; ++r) {
    if (g->members[r].gone) {
      return absl::AbortedError(
          absl::StrCat("rank ", r, " (pid ", g->members[r].session->pid, ") of group ", g->name(),
                       " has left; the group can make no new symmetric allocation"));
    }
  }
  if (request.bytes() == 0 || request.bytes() > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError(
        absl::StrCat("symmetric allocation of ", request.bytes(), " bytes in group ", g->name(),
                     "; allowed 1 byte to limits.max_allocation_bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

void GroupRegistry::AllocateSymmetric(std::shared_ptr<const server::Session> session,
                                      const v1::AllocateSymmetricRequest& request,
                                      v1::SymmetricAllocation* response,
                                      std::shared_ptr<server::PendingCall> call) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    int rank = -1;
    Group* g = table_.FindForMember(*session, request.group_id(), &rank);
    if (absl::Status s = CheckAsk(g, request); !s.ok()) return call->Finish(s);
    const uint64_t index = g->asks_made[rank]++;
    // Failed rounds are kept only until every rank has moved past them.
    const uint64_t oldest = *std::min_element(g->asks_made.begin(), g->asks_made.end());
    g->rounds.erase(g->rounds.begin(), g->rounds.lower_bound(std::min(oldest, index)));
    Round& round = g->rounds[index];
    if (round.failed) return call->Finish(*round.failed);
    round.asks[rank] = Round::Ask{request.bytes(), request.host_memory(), call, response};
    const uint64_t id = g->id;
    call->OnCancel([this, id, index, rank, name = g->name()] { CancelAsk(id, index, rank, name); });
    if (round.asks.size() == 1) {
      const absl::Duration timeout =
          request.timeout_ms() > 0
              ? std::min(absl::Milliseconds(request.timeout_ms()), options_.max_timeout)
              : g->timeout;
      round.timer = timers_->Schedule(absl::Now() + timeout,
                                      [this, id, index] { OnRoundTimeout(id, index); });
    }
    if (static_cast<int>(round.asks.size()) == g->world_size) {
      CompleteRound(*g, index, deferred);
      Changed();
    }
  }
  for (auto& f : deferred) f();
}

void GroupRegistry::CancelAsk(uint64_t group_id, uint64_t index, int rank,
                              const std::string& name) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const std::shared_ptr<Group> g = table_.Find(group_id);
    if (g == nullptr) return;
    FailRound(*g, index,
              absl::AbortedError(absl::StrCat("rank ", rank, " of group ", name,
                                              " cancelled its AllocateSymmetric")),
              deferred);
  }
  for (auto& f : deferred) f();
}

absl::StatusOr<std::shared_ptr<const memory::Allocation>> GroupRegistry::AllocateRankBuffer(
    const Group& g, int rank, uint64_t index, size_t bytes, bool host_memory) {
  const Member& m = g.members[rank];
  return memory_->Allocate({m.session->uid, m.session->job_id, m.session->token},
                           host_memory ? memory::Device::Host() : m.device, bytes,
                           absl::StrCat(g.job(), "/", g.name(), "/sym", index, "/r", rank),
                           v1::SESSION);
}

void GroupRegistry::CompleteRound(Group& g, uint64_t index, Deferred& deferred) {
  Round& round = g.rounds[index];
  timers_->Cancel(round.timer);
  const absl::StatusOr<uint64_t> bytes = CommonSize(g, round);
  if (!bytes.ok()) return FailRound(g, index, bytes.status(), deferred);
  const size_t offset = SymmetricDataOffset(g.world_size);
  SymmetricBuffers buffers;
  for (int r = 0; r < g.world_size; ++r) {
    auto block =
        AllocateRankBuffer(g, r, index, offset + *bytes, round.asks.begin()->second.host_memory);
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
    out->set_bytes(*bytes);
    out->set_signal_pad_bytes(SignalPadBytes(g.world_size));
    out->set_data_offset(offset);
    absl::Status status;
    for (int q = 0; q < g.world_size && status.ok(); ++q) {
      auto handle = memory_->Handle(*buffers.buffers[q], g.members[rank].session->pid, q);
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
    const std::shared_ptr<Group> g = table_.Find(group_id);
    if (g == nullptr) return;
    auto round = g->rounds.find(index);
    if (round == g->rounds.end() || round->second.failed) return;
    std::vector<int> missing;
    for (int r = 0; r < g->world_size; ++r) {
      if (!round->second.asks.contains(r)) missing.push_back(r);
    }
    FailRound(*g, index,
              absl::DeadlineExceededError(absl::StrCat(
                  "group ", g->name(), ": rank(s) ", RankList(missing),
                  " never called AllocateSymmetric (allocation #", index, ") in time")),
              deferred);
  }
  for (auto& f : deferred) f();
}

void GroupRegistry::Abort(uint64_t group_id, const std::string& why) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    const std::shared_ptr<Group> g = table_.Find(group_id);
    if (g == nullptr || g->aborted) return;
    g->aborted = absl::AbortedError(absl::StrCat(
        "group ", g->name(), " aborted ", why, "; the group can make no new symmetric allocation"));
    std::vector<uint64_t> pending;
    for (const auto& [index, round] : g->rounds) pending.push_back(index);
    for (uint64_t index : pending) FailRound(*g, index, *g->aborted, deferred);
  }
  for (auto& f : deferred) f();
}

absl::Status GroupRegistry::ReleaseSymmetric(const server::Session& session,
                                             const v1::ReleaseSymmetricRequest& request) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    int rank = -1;
    Group* g = table_.FindForMember(session, request.group_id(), &rank);
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
        deferred.push_back([this, id = b->id] { memory_->Release(id); });
      }
      g->allocations.erase(it);
      Changed();
    }
  }
  for (auto& f : deferred) f();
  return absl::OkStatus();
}

}  // namespace commd::groups
