#include "daemon/cluster/span_rendezvous.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::cluster {

using Layout = absl::StatusOr<v1::GroupLayout>;

struct EtcdSpanRendezvous::Wait : groups::SpanWait, std::enable_shared_from_this<Wait> {
  EtcdSpanRendezvous* owner = nullptr;
  groups::SpanPart part;
  std::string prefix;  // the group's
  std::string key;     // this node's
  std::string value;   // this node's v1::SpanPart, serialized

  mutable absl::Mutex mu;
  bool published ABSL_GUARDED_BY(mu) = false;  // the put's answer came
  bool finished ABSL_GUARDED_BY(mu) = false;   // done ran, or nobody wants it any more
  bool withdrawn ABSL_GUARDED_BY(mu) = false;
  std::function<void(Layout)> done ABSL_GUARDED_BY(mu);
  std::shared_ptr<EtcdWatch> watch ABSL_GUARDED_BY(mu);
  std::map<std::string, v1::SpanPart> parts ABSL_GUARDED_BY(mu);  // by node name
  std::map<std::string, int64_t> revisions ABSL_GUARDED_BY(mu);   // each part's mod_revision

  std::string Missing() const override;
  void Withdraw() override;

  void Publish();
  void Published(absl::StatusOr<pb::TxnResponse> r);
  void OnWatch(const pb::WatchResponse& r);
  // Stores the part at `kv` (or drops it for a delete).
  void Take(const mvccpb::KeyValue& kv, bool deleted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The layout once the parts cover every global rank, an error at the first disagreement,
  // nothing while ranks are missing.
  std::optional<Layout> Evaluate() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Finish(Layout result);
  // Deletes this node's key if it is still this publication's.
  void DeleteKey();
};

namespace {

// "[0-3, 7, 9-10]", at most kMaxRuns runs (then "... (N more)"): a message stays short
// whatever the group's size.
constexpr size_t kMaxRuns = 32;

std::string RankRuns(const std::vector<int>& sorted) {
  std::vector<std::string> runs;
  size_t more = 0;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (runs.size() < kMaxRuns) {
      runs.push_back(i == j ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    } else {
      more += j - i + 1;
    }
    i = j + 1;
  }
  return absl::StrCat("[", absl::StrJoin(runs, ", "),
                      more > 0 ? absl::StrCat(", ... (", more, " more)") : "", "]");
}

std::vector<int> Sorted(const google::protobuf::RepeatedField<int32_t>& ranks) {
  std::vector<int> v(ranks.begin(), ranks.end());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

EtcdSpanRendezvous::EtcdSpanRendezvous(Cluster* cluster, uint32_t max_per_uid)
    : cluster_(cluster),
      max_per_uid_(max_per_uid),
      // Distinct across restarts of the daemon, which reuse the node's name.
      next_incarnation_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))) {}

EtcdSpanRendezvous::~EtcdSpanRendezvous() { Shutdown(); }

std::string EtcdSpanRendezvous::GroupPrefix(const groups::SpanPart& part) const {
  return absl::StrCat(cluster_->options().prefix, "/jobs/", part.uid, "/", part.job, "/groups/",
                      absl::StrReplaceAll(part.group, {{"/", "%2F"}}), "/nodes/");
}

absl::Status EtcdSpanRendezvous::Admit() const {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is shutting down");
  }
  if (!cluster_->connected()) return cluster_->Unavailable();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<groups::SpanWait>> EtcdSpanRendezvous::Start(
    groups::SpanPart part, std::function<void(Layout)> done) {
  RETURN_IF_ERROR(Admit());
  const int64_t lease = cluster_->lease_id();
  if (lease == 0) return cluster_->Unavailable();
  auto w = std::make_shared<Wait>();
  w->owner = this;
  w->prefix = GroupPrefix(part);
  w->key = w->prefix + cluster_->options().node_name;
  v1::SpanPart value;
  value.set_node(cluster_->options().node_name);
  value.set_global_world_size(part.global_world_size);
  for (int r : part.global_ranks) value.add_global_ranks(r);
  {
    absl::MutexLock lock(&mu_);
    if (held_.of(part.uid) >= max_per_uid_) {
      return UidShareExhausted(part.uid, held_.of(part.uid), max_per_uid_, "groups spanning nodes",
                               "spanning_groups");
    }
    held_.Add(part.uid, 1);
    live_[w.get()] = w;
    value.set_incarnation(next_incarnation_++);
  }
  w->value = value.SerializeAsString();
  w->part = std::move(part);
  {
    absl::MutexLock wl(&w->mu);
    w->done = std::move(done);
  }
  w->Publish();
  return w;
}

void EtcdSpanRendezvous::Release(uid_t uid, const Wait* wait) {
  absl::MutexLock lock(&mu_);
  if (live_.erase(wait) > 0) held_.Sub(uid, 1);
}

void EtcdSpanRendezvous::Shutdown() {
  std::vector<std::shared_ptr<Wait>> waits;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [p, weak] : live_) {
      if (auto w = weak.lock()) waits.push_back(std::move(w));
    }
  }
  // Their keys go with the node's lease, which the cluster revokes as it stops.
  for (auto& w : waits) w->Finish(absl::UnavailableError("the daemon is shutting down"));
}

void EtcdSpanRendezvous::Wait::Publish() {
  // The put and the read of the parts already there in one revision: a part written later
  // comes through the watch, from the next revision on.
  pb::TxnRequest txn;
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(owner->cluster_->lease_id());
  pb::RangeRequest* range = txn.add_success()->mutable_request_range();
  range->set_key(prefix);
  range->set_range_end(PrefixEnd(prefix));
  owner->cluster_->etcd().Txn(txn, [self = shared_from_this()](absl::StatusOr<pb::TxnResponse> r) {
    self->Published(std::move(r));
  });
}

void EtcdSpanRendezvous::Wait::Published(absl::StatusOr<pb::TxnResponse> r) {
  std::optional<Layout> decided;
  bool gone;
  {
    absl::MutexLock wl(&mu);
    published = true;
    gone = withdrawn;
    if (!gone && r.ok()) {
      for (const auto& kv : r->responses(1).response_range().kvs()) Take(kv, false);
      decided = Evaluate();
    }
  }
  // Withdrawn while the put was on its way: the delete could not go before it.
  if (gone) return DeleteKey();
  if (!r.ok()) {
    DeleteKey();  // the put may have landed before its answer was lost
    return Finish(r.status());
  }
  if (decided.has_value()) return Finish(*std::move(decided));
  pb::WatchCreateRequest create;
  create.set_key(prefix);
  create.set_range_end(PrefixEnd(prefix));
  create.set_start_revision(r->header().revision() + 1);
  std::weak_ptr<Wait> weak = shared_from_this();
  auto watch = owner->cluster_->etcd().Watch(
      create,
      [weak](const pb::WatchResponse& response) {
        if (auto self = weak.lock()) self->OnWatch(response);
      },
      [weak](absl::Status end) {
        if (auto self = weak.lock(); self != nullptr && !end.ok()) self->Finish(std::move(end));
      });
  absl::MutexLock wl(&mu);
  if (finished) {
    if (watch != nullptr) watch->Cancel();
  } else {
    this->watch = std::move(watch);
  }
}

void EtcdSpanRendezvous::Wait::OnWatch(const pb::WatchResponse& r) {
  if (r.canceled()) {
    return Finish(absl::UnavailableError(
        absl::StrCat("etcd at ", owner->cluster_->etcd().endpoint(),
                     " cancelled the watch of group ", part.group, ": ", r.cancel_reason())));
  }
  std::optional<Layout> decided;
  {
    absl::MutexLock wl(&mu);
    if (finished) return;
    // One answer may carry a node's put and its delete (it saw a conflict and withdrew): each
    // put is judged as it came, or this node would never see what the other one saw.
    for (const auto& e : r.events()) {
      const bool deleted = e.type() == mvccpb::Event::DELETE;
      Take(e.kv(), deleted);
      if (deleted && e.kv().key() == key) {
        // Not this wait's Withdraw (that ends the wait first): the node's lease expired while
        // etcd was out of reach, and the other nodes no longer see this node.
        decided = absl::UnavailableError(
            absl::StrCat("this node's part of group ", part.group, " vanished from etcd at ",
                         owner->cluster_->etcd().endpoint(),
                         " (the node's lease expired while etcd was out of reach); join again"));
        break;
      }
      if (deleted) continue;
      decided = Evaluate();
      if (decided.has_value()) break;
    }
  }
  if (decided.has_value()) Finish(*std::move(decided));
}

void EtcdSpanRendezvous::Wait::Take(const mvccpb::KeyValue& kv, bool deleted) {
  if (kv.key().size() <= prefix.size()) return;
  const std::string node = kv.key().substr(prefix.size());
  if (deleted) {
    parts.erase(node);  // that node's ranks left (or its daemon died): wait for them again
    revisions.erase(node);
    return;
  }
  revisions[node] = kv.mod_revision();
  v1::SpanPart p;
  if (!p.ParseFromString(kv.value())) p.set_global_world_size(-1);  // Evaluate names it
  parts[node] = std::move(p);
}

std::optional<Layout> EtcdSpanRendezvous::Wait::Evaluate() const {
  const std::string& self = owner->cluster_->options().node_name;
  const int size = part.global_world_size;
  // Who holds each global rank; at most `size` entries, since a rank out of range or held
  // twice ends the wait.
  std::map<int, const std::string*> holder;
  for (const auto& [node, p] : parts) {
    if (p.global_world_size() != size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group ", part.group, ": node ", QuoteForError(node), " gives global world size ",
          p.global_world_size(), " but node ", QuoteForError(self), " (this node) gives ", size,
          "; every rank on every node must give the same"));
    }
    for (int r : p.global_ranks()) {
      if (r < 0 || r >= size) {
        return absl::FailedPreconditionError(
            absl::StrCat("group ", part.group, ": node ", QuoteForError(node),
                         " claims global rank ", r, ", outside 0 to ", size - 1));
      }
      auto [it, fresh] = holder.emplace(r, &node);
      if (!fresh) {
        return absl::FailedPreconditionError(
            absl::StrCat("group ", part.group, ": global rank ", r, " is claimed by node ",
                         QuoteForError(*it->second), " and node ", QuoteForError(node),
                         "; each global rank must be on one node"));
      }
    }
  }
  if (static_cast<int>(holder.size()) < size) return std::nullopt;
  v1::GroupLayout layout;
  for (const auto& [node, revision] : revisions) {
    layout.set_formation(std::max(layout.formation(), static_cast<uint64_t>(revision)));
  }
  for (const auto& [node, p] : parts) {  // std::map: sorted by node name
    if (node == self) layout.set_this_node(layout.nodes_size());
    v1::NodeRanks* n = layout.add_nodes();
    n->set_node(node);
    *n->mutable_global_ranks() = p.global_ranks();
  }
  return layout;
}

std::string EtcdSpanRendezvous::Wait::Missing() const {
  absl::MutexLock wl(&mu);
  std::set<int> held;
  std::vector<std::string> nodes;
  for (const auto& [node, p] : parts) {
    held.insert(p.global_ranks().begin(), p.global_ranks().end());
    if (nodes.size() < kMaxRuns) {
      nodes.push_back(absl::StrCat(node, " ", RankRuns(Sorted(p.global_ranks()))));
    }
  }
  std::vector<int> missing;
  for (int r = 0; r < part.global_world_size; ++r) {
    if (!held.contains(r)) missing.push_back(r);
  }
  return absl::StrCat("global rank(s) ", RankRuns(missing),
                      " never joined (nodes joined: ", absl::StrJoin(nodes, ", "),
                      parts.size() > nodes.size()
                          ? absl::StrCat(", ... (", parts.size() - nodes.size(), " more)")
                          : "",
                      ")");
}

void EtcdSpanRendezvous::Wait::Finish(Layout result) {
  std::function<void(Layout)> callback;
  std::shared_ptr<EtcdWatch> w;
  {
    absl::MutexLock wl(&mu);
    if (finished) return;
    finished = true;
    callback = std::move(done);
    w = std::move(watch);
  }
  if (w != nullptr) w->Cancel();
  if (callback) callback(std::move(result));
}

void EtcdSpanRendezvous::Wait::Withdraw() {
  std::shared_ptr<EtcdWatch> w;
  bool delete_now;
  {
    absl::MutexLock wl(&mu);
    if (withdrawn) return;
    withdrawn = true;
    finished = true;
    done = nullptr;
    w = std::move(watch);
    delete_now = published;  // else Published deletes it when the put's answer comes
  }
  if (w != nullptr) w->Cancel();
  if (delete_now) DeleteKey();
  owner->Release(part.uid, this);
}

void EtcdSpanRendezvous::Wait::DeleteKey() {
  // Only this publication: a newer one of the same group by this node has another value
  // (its incarnation), and a delete arriving late must not take it.
  pb::TxnRequest txn;
  pb::Compare* same = txn.add_compare();
  same->set_key(key);
  same->set_target(pb::Compare::VALUE);
  same->set_result(pb::Compare::EQUAL);
  same->set_value(value);
  txn.add_success()->mutable_request_delete_range()->set_key(key);
  owner->cluster_->etcd().Txn(txn, [](absl::StatusOr<pb::TxnResponse>) {});
}

}  // namespace commd::cluster
