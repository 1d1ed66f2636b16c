#include "daemon/cluster/node_directory.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/log.h"

namespace commd::cluster {
namespace {

constexpr char kLeaseEnded[] = "its commd's lease in etcd ended";
constexpr char kRegisteredAgain[] =
    "its commd registered again on a new lease (restarted, or cut off past its lease), so "
    "nothing watches the ranks its earlier run held";

}  // namespace

NodeDirectory::NodeDirectory(Cluster* cluster, OnGone on_gone, NodeViewLimits limits)
    : cluster_(cluster),
      prefix_(cluster->options().prefix + "/nodes/"),
      on_gone_(std::move(on_gone)),
      limits_(limits),
      view_(limits, cluster->options().node_name) {
  watch_ = std::make_unique<PrefixWatch>(
      cluster_, prefix_,
      PrefixWatchCallbacks{
          .on_event = [this](const mvccpb::Event& e) { OnEvent(e); },
          .on_state = [this](bool open) { OnWatchState(open); },
          .on_list = [this](const pb::RangeResponse& r) { OnList(r); },
          // One more than the view keeps: the answer says whether there are more.
          .list_limit = static_cast<int64_t>(limits_.max_live) + 1,
      });
}

NodeDirectory::~NodeDirectory() { Stop(); }

void NodeDirectory::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  watch_->Stop();
}

void NodeDirectory::Gone(const std::string& node, int64_t revision, absl::string_view why) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
  }
  if (node == cluster_->options().node_name) return;
  COMMD_LOG(WARNING, "cluster") << "node " << node << " is gone: " << why;
  on_gone_(node, revision, why);
}

void NodeDirectory::OnEvent(const mvccpb::Event& e) {
  const std::string node = e.kv().key().substr(prefix_.size());
  const int64_t revision = e.kv().mod_revision();
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    if (e.type() == mvccpb::Event::PUT) {
      (void)view_.Put(node, e.kv().value(), e.kv().lease(), revision, absl::Now(), &ended);
    } else {
      (void)view_.Delete(node, revision, absl::Now());
      ended = true;  // told even when the view did not hold it: a node may be in a group anyway
    }
  }
  if (ended) Gone(node, revision, e.type() == mvccpb::Event::PUT ? kRegisteredAgain : kLeaseEnded);
}

void NodeDirectory::OnWatchState(bool open) {
  absl::MutexLock lock(&mu_);
  view_.SetWatching(open, absl::Now());
}

void NodeDirectory::OnList(const pb::RangeResponse& r) {
  std::vector<NodeKeyValue> kvs;
  kvs.reserve(r.kvs_size());
  for (const auto& kv : r.kvs()) {
    kvs.push_back({.name = kv.key().substr(prefix_.size()),
                   .value = kv.value(),
                   .lease = kv.lease(),
                   .mod_revision = kv.mod_revision()});
  }
  std::vector<std::string> ended;
  {
    absl::MutexLock lock(&mu_);
    ended = view_.Reconcile(kvs, r.header().revision(), !r.more(), absl::Now());
  }
  // A read cannot tell a deletion from a takeover it did not see: a node missing from it had
  // its lease end, one on a new lease registered again.
  for (const std::string& node : ended) {
    const bool present = std::any_of(kvs.begin(), kvs.end(),
                                     [&](const NodeKeyValue& kv) { return kv.name == node; });
    Gone(node, r.header().revision(), present ? kRegisteredAgain : kLeaseEnded);
  }
}

absl::StatusOr<v1::ListClusterNodesResponse> NodeDirectory::List(
    const v1::ListClusterNodesRequest& request) {
  const LeaseState self = cluster_->lease_state();
  absl::MutexLock lock(&mu_);
  return view_.List(request, self, absl::Now());
}

}  // namespace commd::cluster
