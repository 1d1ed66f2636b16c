// GroupRegistry's construction and member lifecycle: ranks leaving (closing their session or
// dying), the release of their memory after the grace period, and the group's retirement once
// every rank has gone. The rendezvous is in rendezvous.cc, the symmetric rounds in
// symmetric_rounds.cc.
#include "daemon/groups/group_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/metrics/histograms.h"

namespace commd::groups {

GroupRegistry::GroupRegistry(GroupsOptions options, memory::AllocationTable* memory,
                             server::TimerQueue* timers, prometheus::Registry* registry)
    : options_(options),
      memory_(memory),
      timers_(timers),
      table_({.max_groups = options.max_groups,
              .max_groups_forming_per_uid = options.max_groups_forming_per_uid}) {
  groups_gauge_ = &prometheus::BuildGauge()
                       .Name("commd_groups")
                       .Help("Groups forming or active")
                       .Register(*registry)
                       .Add({});
  rendezvous_seconds_ = &metrics::AddHistogram(*registry, "commd_rendezvous_duration_seconds",
                                               "From the first rank's join to the group forming",
                                               metrics::GeometricBuckets(1e-4, 4, 1000));
}

GroupRegistry::~GroupRegistry() = default;

size_t GroupRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return table_.size();
}

void GroupRegistry::Changed() {
  table_.Publish();
  groups_gauge_->Set(static_cast<double>(table_.size()));
}

void GroupRegistry::ReleaseLater(std::vector<uint64_t> ids, Deferred& deferred) {
  if (ids.empty()) return;
  auto release = [this, ids] {
    for (uint64_t id : ids) memory_->Release(id);
  };
  if (options_.release_grace <= absl::ZeroDuration()) {
    deferred.push_back(std::move(release));
  } else {
    timers_->Schedule(absl::Now() + options_.release_grace, std::move(release));
  }
}

void GroupRegistry::MemberGone(Group& g, int rank, const server::SessionEnd& end,
                               Deferred& deferred) {
  Member& m = g.members[rank];
  m.gone = true;
  m.died = end.process_exited();
  const std::string text = DepartureText(rank, m.session->pid, end, &g);
  if (m.died && options_.on_rank_death) {
    // The dead rank's last entries, and its peers' view of the same moment.
    deferred.push_back(
        [hook = options_.on_rank_death,
         death = RankDeath{.group = SnapshotOf(g), .rank = rank, .text = text}] { hook(death); });
  }
  const absl::Status status = absl::AbortedError(absl::StrCat(text, " (group ", g.name(), ")"));
  // Nobody can complete an allocation this rank will never ask for.
  for (auto& [index, round] : g.rounds) FailRound(g, index, status, deferred);
  std::vector<uint64_t> ids;
  if (m.control_block) ids.push_back(m.control_block->id);
  for (auto& [id, allocation] : g.allocations) {
    ids.push_back(allocation.buffers[rank]->id);
    allocation.released[rank] = true;
  }
  ReleaseLater(std::move(ids), deferred);
  bool all_gone = true;
  for (const Member& other : g.members) all_gone = all_gone && other.gone;
  if (all_gone) Retire(g);
}

void GroupRegistry::set_span_rendezvous(SpanRendezvous* span) {
  absl::MutexLock lock(&mu_);
  span_ = span;
}

void GroupRegistry::Retire(Group& g) {
  g.retired = true;
  // The group's last local rank left: this node's part of a spanning group goes.
  if (g.span != nullptr) std::exchange(g.span, nullptr)->Withdraw();
  table_.Remove(g);  // buffers are freed by the ReleaseLater timers already scheduled
}

void GroupRegistry::OnSessionEnd(const server::Session& session, const server::SessionEnd& end) {
  Deferred deferred;
  {
    absl::MutexLock lock(&mu_);
    bool changed = false;
    for (const std::shared_ptr<Group>& g : table_.All()) {
      for (int r = 0; r < g->world_size; ++r) {
        Member& m = g->members[r];
        if (!m.joined || m.gone || m.session->token != session.token) continue;
        changed = true;
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
    if (changed) Changed();
  }
  for (auto& f : deferred) f();
}

}  // namespace commd::groups
