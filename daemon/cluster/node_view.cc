#include "daemon/cluster/node_view.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "nlohmann/json.hpp"

namespace commd::cluster {
namespace {

// A string field of a node's value, cut to NodeView::kMaxFieldBytes.
std::string Field(const nlohmann::json& value, const char* name) {
  auto it = value.find(name);
  if (it == value.end() || !it->is_string()) return "";
  std::string s = it->get<std::string>();
  if (s.size() > NodeView::kMaxFieldBytes) s.resize(NodeView::kMaxFieldBytes);
  return s;
}

int64_t Number(const nlohmann::json& value, const char* name) {
  auto it = value.find(name);
  return it != value.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

void NodeView::ParseValue(const std::string& value, v1::ClusterNode* node) {
  node->clear_owner();
  node->clear_pid();
  node->clear_version();
  node->clear_metrics_address();
  node->clear_lease_ttl_seconds();
  // What commd writes is a few hundred bytes; anything much larger is not commd's.
  if (value.size() > kMaxValueBytes) return;
  const nlohmann::json v = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!v.is_object()) return;
  node->set_owner(Field(v, "owner"));
  node->set_pid(Number(v, "pid"));
  node->set_version(Field(v, "version"));
  node->set_metrics_address(Field(v, "metrics"));
  node->set_lease_ttl_seconds(std::max<int64_t>(0, Number(v, "lease_ttl_s")));
}

bool NodeView::Put(const std::string& name, const std::string& value, int64_t lease,
                   int64_t revision, absl::Time now, bool* replaced) {
  if (replaced != nullptr) *replaced = false;
  if (!ValidateJobId(name).ok()) {
    ++rejected_;
    return false;
  }
  revision_ = std::max(revision_, revision);
  changed_ = now;
  auto it = nodes_.find(name);
  if (it != nodes_.end() && it->second.node.revision() > revision) return true;  // stale
  if (it == nodes_.end() || !it->second.node.live()) {
    if (live_ >= limits_.max_live) {
      incomplete_ = true;
      return true;
    }
    ++live_;
  }
  if (it == nodes_.end()) it = nodes_.emplace(name, Entry{}).first;
  v1::ClusterNode& node = it->second.node;
  // A new lease is a new registration: a daemon (re)started or came back after losing it.
  if (!node.live() || node.lease_id() != lease) node.set_since_unix_ms(absl::ToUnixMillis(now));
  if (replaced != nullptr) *replaced = node.live() && node.lease_id() != lease;
  node.set_name(name);
  node.set_live(true);
  node.set_lease_id(lease);
  node.set_revision(revision);
  ParseValue(value, &node);
  return true;
}

bool NodeView::Delete(const std::string& name, int64_t revision, absl::Time now) {
  revision_ = std::max(revision_, revision);
  changed_ = now;
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    // Never seen live (the view was full, or it came and went while the watch was down): the
    // node is still known to have gone, when the view has room for that.
    if (!ValidateJobId(name).ok()) return false;
    it = nodes_.emplace(name, Entry{}).first;
    it->second.node.set_name(name);
    it->second.node.set_live(false);
  } else if (it->second.node.revision() > revision) {
    return false;  // stale: the node registered again after this deletion
  } else if (!it->second.node.live()) {
    return false;  // seen going already (a replayed event, or a read after it): since stays
  }
  const bool was_live = it->second.node.live();
  if (was_live) --live_;
  v1::ClusterNode& node = it->second.node;
  node.set_live(false);
  node.set_since_unix_ms(absl::ToUnixMillis(now));
  node.set_revision(revision);
  Prune(now);
  return was_live;
}

std::vector<std::string> NodeView::Reconcile(const std::vector<NodeKeyValue>& kvs, int64_t revision,
                                             bool complete, absl::Time now) {
  std::set<std::string> present;
  std::set<std::string> ended;
  incomplete_ = !complete;
  rejected_ = 0;  // counted anew from what etcd holds
  for (const NodeKeyValue& kv : kvs) {
    bool replaced = false;
    if (Put(kv.name, kv.value, kv.lease, kv.mod_revision, now, &replaced)) present.insert(kv.name);
    if (replaced) ended.insert(kv.name);
  }
  // Past the read's limit nothing can be said of the keys it did not return.
  if (complete) {
    std::vector<std::string> gone;
    for (const auto& [name, e] : nodes_) {
      if (e.node.live() && e.node.revision() <= revision && !present.contains(name)) {
        gone.push_back(name);
      }
    }
    for (const std::string& name : gone) {
      if (Delete(name, revision, now)) ended.insert(name);
    }
  }
  revision_ = std::max(revision_, revision);
  changed_ = now;
  return {ended.begin(), ended.end()};
}

void NodeView::SetWatching(bool watching, absl::Time now) {
  watching_ = watching;
  if (!watching) changed_ = now;
}

void NodeView::Prune(absl::Time now) {
  std::vector<std::pair<int64_t, std::string>> gone;  // since, name
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const v1::ClusterNode& n = it->second.node;
    if (!n.live() && absl::FromUnixMillis(n.since_unix_ms()) + limits_.gone_kept < now) {
      it = nodes_.erase(it);
      continue;
    }
    if (!n.live()) gone.emplace_back(n.since_unix_ms(), it->first);
    ++it;
  }
  if (gone.size() <= limits_.max_gone) return;
  std::sort(gone.begin(), gone.end());
  for (size_t i = 0; i + limits_.max_gone < gone.size(); ++i) nodes_.erase(gone[i].second);
}

absl::StatusOr<v1::ListClusterNodesResponse> NodeView::List(
    const v1::ListClusterNodesRequest& request, const LeaseState& self, absl::Time now) {
  if (request.limit() > kMaxAnswer) {
    return absl::InvalidArgumentError(absl::StrCat("limit ", request.limit(),
                                                   " is out of range; allowed 1 to ", kMaxAnswer,
                                                   " nodes per answer (0: ", kMaxAnswer, ")"));
  }
  if (!request.start_after().empty() && !ValidateJobId(request.start_after()).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_after ", QuoteForError(request.start_after()),
                     " names no node; allowed: empty, or 1 to 128 of letters, digits and . _ - :"));
  }
  Prune(now);
  const uint32_t limit = request.limit() == 0 ? kMaxAnswer : request.limit();
  v1::ListClusterNodesResponse out;
  auto it =
      request.start_after().empty() ? nodes_.begin() : nodes_.upper_bound(request.start_after());
  for (; it != nodes_.end() && static_cast<uint32_t>(out.nodes_size()) < limit; ++it) {
    v1::ClusterNode* node = out.add_nodes();
    *node = it->second.node;
    node->set_this_node(it->first == this_node_);
    node->set_lease_remaining_seconds(-1);
    if (node->this_node() && node->live() && self.id != 0 && self.id == node->lease_id()) {
      node->set_lease_ttl_seconds(self.ttl_seconds);
      node->set_lease_remaining_seconds(self.remaining_seconds);
    }
  }
  out.set_truncated(it != nodes_.end());
  out.set_live_nodes(static_cast<uint32_t>(live_));
  out.set_gone_nodes(static_cast<uint32_t>(nodes_.size() - live_));
  out.set_watching(watching_);
  out.set_view_unix_ms(changed_ == absl::InfinitePast() ? 0 : absl::ToUnixMillis(changed_));
  out.set_revision(revision_);
  out.set_incomplete(incomplete_);
  out.set_rejected_keys(rejected_);
  return out;
}

}  // namespace commd::cluster
