#include "daemon/cluster/node_directory.h"

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/log.h"

namespace commd::cluster {

NodeDirectory::NodeDirectory(Cluster* cluster,
                             std::function<void(const std::string&, int64_t)> on_gone,
                             NodeViewLimits limits)
    : cluster_(cluster),
      prefix_(cluster->options().prefix + "/nodes/"),
      on_gone_(std::move(on_gone)),
      limits_(limits),
      view_(limits, cluster->options().node_name) {
  watch_ = std::make_unique<PrefixWatch>(
      cluster_, prefix_, [this](const mvccpb::Event& e) { OnEvent(e); },
      [this](bool open) { OnWatchState(open); });
}

NodeDirectory::~NodeDirectory() { Stop(); }

void NodeDirectory::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  watch_->Stop();
}

void NodeDirectory::OnEvent(const mvccpb::Event& e) {
  const std::string node = e.kv().key().substr(prefix_.size());
  const int64_t revision = e.kv().mod_revision();
  {
    absl::MutexLock lock(&mu_);
    if (e.type() == mvccpb::Event::PUT) {
      (void)view_.Put(node, e.kv().value(), e.kv().lease(), revision, absl::Now());
      return;
    }
    (void)view_.Delete(node, revision, absl::Now());
    if (stopped_) return;
  }
  if (node == cluster_->options().node_name) return;
  COMMD_LOG(WARNING, "cluster") << "node " << node << " is gone: its lease in etcd ended";
  on_gone_(node, revision);
}

void NodeDirectory::OnWatchState(bool open) {
  {
    absl::MutexLock lock(&mu_);
    view_.SetWatching(open, absl::Now());
    if (!open || stopped_) return;
  }
  // The watch replays what it can from where it stopped; a read covers what etcd compacted
  // meanwhile (and, at the first opening, what was there before).
  Read();
}

void NodeDirectory::Read() {
  pb::RangeRequest range;
  range.set_key(prefix_);
  range.set_range_end(PrefixEnd(prefix_));
  // One more than the view keeps: the answer says whether there are more.
  range.set_limit(static_cast<int64_t>(limits_.max_live) + 1);
  cluster_->etcd().Range(range, [this](absl::StatusOr<pb::RangeResponse> r) {
    if (!r.ok()) {
      // The watch goes on; the next opening reads again.
      COMMD_LOG(WARNING, "cluster") << "reading the nodes under " << prefix_ << ": " << r.status();
      return;
    }
    std::vector<NodeKeyValue> kvs;
    kvs.reserve(r->kvs_size());
    for (const auto& kv : r->kvs()) {
      kvs.push_back({.name = kv.key().substr(prefix_.size()),
                     .value = kv.value(),
                     .lease = kv.lease(),
                     .mod_revision = kv.mod_revision()});
    }
    absl::MutexLock lock(&mu_);
    view_.Reconcile(kvs, r->header().revision(), !r->more(), absl::Now());
  });
}

absl::StatusOr<v1::ListClusterNodesResponse> NodeDirectory::List(
    const v1::ListClusterNodesRequest& request) {
  const LeaseState self = cluster_->lease_state();
  absl::MutexLock lock(&mu_);
  return view_.List(request, self, absl::Now());
}

}  // namespace commd::cluster
