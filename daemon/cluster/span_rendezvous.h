// The rendezvous of groups that span nodes, through the cluster's etcd (the backend of
// daemon/groups/span_rendezvous.h; docs/cluster.md, "Groups that span nodes").
//
//   EtcdSpanRendezvous span(&cluster, /*max_per_uid=*/64);
//   registry.set_span_rendezvous(&span);
//   ...
//   span.Shutdown();  // before cluster.Stop()
//
// Each node publishes its part of a group under
//   <prefix>/jobs/<uid>/<job>/groups/<group>/nodes/<node_name>
// (a v1::SpanPart, on the node's lease, so it goes when the daemon dies), in one transaction
// that also reads the parts already there, then watches the group's prefix from that
// revision: every part written after its own is seen, none twice. The wait ends when the parts
// cover every global rank exactly once (the layout: nodes sorted by name), or at the first
// disagreement (FAILED_PRECONDITION naming both values and both nodes), or when the watch
// breaks (UNAVAILABLE naming etcd). The registry's own deadline ends it otherwise. What the
// daemon holds per wait is bounded by the global world size, which the join validated before
// anything was published. Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_SPAN_RENDEZVOUS_H_
#define COMMD_DAEMON_CLUSTER_SPAN_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/uid_share.h"
#include "daemon/cluster/cluster.h"
#include "daemon/groups/span_rendezvous.h"

namespace commd::cluster {

class EtcdSpanRendezvous : public groups::SpanRendezvous {
 public:
  // `cluster` must outlive this object. `max_per_uid`: limits.per_uid.spanning_groups.
  EtcdSpanRendezvous(Cluster* cluster, uint32_t max_per_uid);
  ~EtcdSpanRendezvous() override;  // Shutdown()

  absl::Status Admit() const override;
  absl::StatusOr<std::shared_ptr<groups::SpanWait>> Start(
      groups::SpanPart part, std::function<void(absl::StatusOr<v1::GroupLayout>)> done) override;
  void Shutdown() override;

  // "<prefix>/jobs/<uid>/<job>/groups/<group>/nodes/": the group name's '/' written as %2F,
  // so that no group's prefix holds another group's keys.
  std::string GroupPrefix(const groups::SpanPart& part) const;

  struct Wait;

 private:
  friend struct Wait;
  void Release(uid_t uid, const Wait* wait);

  Cluster* const cluster_;
  const uint32_t max_per_uid_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_);
  UidTally held_ ABSL_GUARDED_BY(mu_);  // parts published or waiting, per uid
  std::map<const Wait*, std::weak_ptr<Wait>> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_SPAN_RENDEZVOUS_H_
