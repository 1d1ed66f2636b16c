#include "daemon/cluster/progress.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"

namespace commd::cluster {

std::string ProgressKey(const std::string& prefix, uint32_t uid, const std::string& job,
                        const std::string& group, const std::string& node) {
  return absl::StrCat(prefix, "/progress/", uid, "/", job, "/", group, "/", node);
}

std::optional<ProgressKeyParts> ParseProgressKey(const std::string& prefix,
                                                 const std::string& key) {
  const std::string root = prefix + "/progress/";
  if (key.rfind(root, 0) != 0) return std::nullopt;
  const std::string rest = key.substr(root.size());
  const size_t uid_end = rest.find('/');
  const size_t job_end = uid_end == std::string::npos ? uid_end : rest.find('/', uid_end + 1);
  const size_t node_start = rest.rfind('/');
  if (job_end == std::string::npos || node_start <= job_end) return std::nullopt;
  ProgressKeyParts p;
  p.job = rest.substr(uid_end + 1, job_end - uid_end - 1);
  p.group = rest.substr(job_end + 1, node_start - job_end - 1);
  p.node = rest.substr(node_start + 1);
  if (!absl::SimpleAtoi(rest.substr(0, uid_end), &p.uid) || !ValidateJobId(p.job).ok() ||
      !ValidateName("group", p.group).ok() || !ValidateJobId(p.node).ok()) {
    return std::nullopt;
  }
  return p;
}

ProgressBoard::ProgressBoard(Cluster* cluster, prometheus::Registry* registry) : cluster_(cluster) {
  auto& family = prometheus::BuildCounter()
                     .Name("commd_cluster_progress_writes_total")
                     .Help(
                         "Writes of this node's group views to etcd (on change, at most one a "
                         "second per group), and those that failed")
                     .Register(*registry);
  writes_ = &family.Add({{"result", "ok"}});
  write_failures_ = &family.Add({{"result", "failed"}});
  // Views hang on the node's lease: a new lease (first connection, or after the old one
  // expired while etcd was away) needs them written again, and so do the views that changed
  // while etcd was away (Write skips them).
  cluster_->AddOnConnected([this] { RepublishAll(); });
}

void ProgressBoard::Write(const std::string& key, const std::string& value) {
  const int64_t lease = cluster_->lease();
  if (lease == 0 || !cluster_->connected()) return;  // RepublishAll writes it on connecting
  pb::TxnRequest txn;
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  // The etcd client drains its calls before the cluster stops, and this object outlives that.
  cluster_->etcd().Txn(txn, [this, key](absl::StatusOr<pb::TxnResponse> r) {
    if (r.ok()) return writes_->Increment();
    write_failures_->Increment();
    COMMD_LOG(WARNING, "cluster") << "cannot write " << key << ": " << r.status();
  });
}

void ProgressBoard::Publish(v1::NodeGroupView view) {
  view.set_node(cluster_->options().node_name);
  const v1::GroupHealth& h = view.health();
  const std::string key =
      ProgressKey(cluster_->options().prefix, h.uid(), h.job_id(), h.group(), view.node());
  const std::string value = view.SerializeAsString();
  {
    absl::MutexLock lock(&mu_);
    current_[{h.uid(), h.job_id(), h.group()}] = std::move(view);
  }
  Write(key, value);
}

void ProgressBoard::Remove(uint32_t uid, const std::string& job_id, const std::string& group) {
  {
    absl::MutexLock lock(&mu_);
    current_.erase({uid, job_id, group});
  }
  if (!cluster_->connected()) return;  // the key goes with the node's lease, or stays stale
  pb::TxnRequest txn;
  txn.add_success()->mutable_request_delete_range()->set_key(
      ProgressKey(cluster_->options().prefix, uid, job_id, group, cluster_->options().node_name));
  cluster_->etcd().Txn(txn, [](auto) {});
}

void ProgressBoard::RepublishAll() {
  std::vector<std::pair<std::string, std::string>> writes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [k, view] : current_) {
      writes.emplace_back(ProgressKey(cluster_->options().prefix, std::get<0>(k), std::get<1>(k),
                                      std::get<2>(k), view.node()),
                          view.SerializeAsString());
    }
  }
  for (const auto& [key, value] : writes) Write(key, value);
}

void ProgressBoard::Read(std::optional<uint32_t> uid, const std::string& job_id,
                         const std::string& group, ReadDone done) {
  if (!cluster_->connected()) return done(cluster_->Unavailable());
  const std::string prefix = cluster_->options().prefix;
  // One uid's job: its own range. Any uid's (an admin naming a job): every job's, filtered.
  const std::string from = uid ? absl::StrCat(prefix, "/progress/", *uid, "/", job_id, "/",
                                              group.empty() ? "" : group + "/")
                               : absl::StrCat(prefix, "/progress/");
  pb::RangeRequest range;
  range.set_key(from);
  range.set_range_end(PrefixEnd(from));
  range.set_limit(kMaxViewsRead);
  cluster_->etcd().Range(
      range, [prefix, job_id, group, done = std::move(done)](absl::StatusOr<pb::RangeResponse> r) {
        if (!r.ok()) return done(r.status());
        std::vector<v1::NodeGroupView> views;
        for (const auto& kv : r->kvs()) {
          std::optional<ProgressKeyParts> parts = ParseProgressKey(prefix, kv.key());
          if (!parts || parts->job != job_id || (!group.empty() && parts->group != group)) continue;
          v1::NodeGroupView view;
          if (!view.ParseFromString(kv.value())) continue;
          views.push_back(std::move(view));
        }
        if (r->more()) {
          COMMD_LOG(WARNING, "cluster")
              << "the cluster's view of job " << job_id << " has more than " << kMaxViewsRead
              << " keys; the first " << kMaxViewsRead << " are shown";
        }
        std::sort(views.begin(), views.end(), [](const auto& a, const auto& b) {
          return std::tie(a.health().group(), a.node()) < std::tie(b.health().group(), b.node());
        });
        done(std::move(views));
      });
}

}  // namespace commd::cluster
