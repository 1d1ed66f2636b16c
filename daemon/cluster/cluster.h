// This daemon's membership in the cluster (docs/cluster.md): a lease in etcd that is its
// liveness, kept alive from one thread, and the node's key <prefix>/nodes/<node_name>
// attached to it. The state is connected or disconnected; each change is logged once and
// shown in GetStatus and commd_cluster_connected.
//
//   ASSIGN_OR_RETURN(auto cluster, Cluster::Start(options, &registry));
//   if (!cluster->connected()) return cluster->Unavailable();
//   cluster->etcd().Range(...);
//
// While etcd is unreachable the thread retries with exponential back-off (retry_initial up
// to retry_max); when etcd answers again the node registers again, on a new lease if the old
// one expired meanwhile. Other components refresh their own leases on this thread's beat
// (AddLeaseSource), so the daemon keeps one stream of keep-alives. Thread-safe.
//
// Metrics: commd_cluster_connected, commd_cluster_nodes, and the node's lease as an operator
// watches it expire: commd_cluster_lease_ttl_seconds (as granted),
// commd_cluster_lease_remaining_seconds (what etcd's last answer left of it, less the time
// since, computed at each scrape: lease_gauges()), commd_cluster_lease_keepalives_total{result}
// and commd_cluster_lease_grants_total.
#ifndef COMMD_DAEMON_CLUSTER_CLUSTER_H_
#define COMMD_DAEMON_CLUSTER_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "commd/v1/config.pb.h"
#include "commd/v1/node.pb.h"
#include "daemon/cluster/etcd_client.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace commd::cluster {

struct ClusterOptions {
  std::vector<std::string> endpoints;
  std::optional<EtcdTls> tls;  // unset: plain gRPC
  std::string node_name;
  std::string prefix = "/commd";
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration retry_initial = absl::Milliseconds(200);
  absl::Duration retry_max = absl::Seconds(10);
  absl::Duration keepalive = absl::Seconds(10);
  std::string node_info;  // the value of the node's key (JSON: host, pid, version, metrics)
};

// Options from the config's cluster section; `hostname` names the node when node_name is
// empty. Reads the TLS files: INVALID_ARGUMENT naming the field and the file when one cannot
// be read, or when only one of cert_file and key_file is set.
absl::StatusOr<ClusterOptions> ClusterOptionsFromConfig(const v1::ClusterConfig& config,
                                                        const std::string& hostname);

// etcd counts lease TTLs in whole seconds: `ttl` rounded up, at least 1.
int64_t LeaseSeconds(absl::Duration ttl);

class LeaseGauges;

// The node's lease as the last answer of etcd left it (Cluster::lease_state).
struct LeaseState {
  int64_t id = 0;           // 0: no lease
  int64_t ttl_seconds = 0;  // as granted
  // What etcd's last answer (the grant or a keep-alive) left of it, less the time since; 0 at
  // the most.
  double remaining_seconds = 0;
};

// Leases another component keeps alive on the cluster's beat: `ids` lists them, `refreshed`
// hears each one's remaining TTL (0: etcd no longer has it).
struct LeaseSource {
  std::function<std::vector<int64_t>()> ids;
  std::function<void(int64_t id, int64_t ttl_seconds)> refreshed;
};

class Cluster {
 public:
  // Starts the connection thread; returns at once, connected or not.
  static std::unique_ptr<Cluster> Start(ClusterOptions options, prometheus::Registry* registry);
  ~Cluster();  // Stop()

  // Ends the thread and revokes the node's lease, so its key goes at once. Idempotent.
  void Stop();

  bool connected() const;
  // UNAVAILABLE naming the endpoint and why the cluster is unreachable.
  absl::Status Unavailable() const;
  void FillStatus(v1::ClusterStatus* status) const;

  EtcdClient& etcd() { return etcd_; }
  // The node's lease while connected, else 0: keys on it go when the daemon dies.
  int64_t lease_id() const;
  const ClusterOptions& options() const { return options_; }
  // "<prefix>/nodes/<node_name>"
  std::string NodeKey() const;

  // Register before anything needs refreshing; not removable.
  void AddLeaseSource(LeaseSource source);

  // The node's lease (0 while not registered).
  int64_t lease() const;
  // The node's lease, its granted TTL and what is left of it now.
  LeaseState lease_state() const;
  // commd_cluster_lease_ttl_seconds and commd_cluster_lease_remaining_seconds, computed when
  // scraped (Metrics::Register it; it stays valid after the Cluster is gone, reporting 0).
  std::shared_ptr<prometheus::Collectable> lease_gauges() const;
  // Runs `callback` on the cluster's thread each time the node is connected with a lease
  // after it was not: at the first connection, after a lost lease (registered anew), and when
  // etcd answers again after an outage (the lease may have outlived it). Keys on the node's
  // lease, and writes that failed meanwhile, are to be written again then. connected() and
  // lease() already say so when it runs. Add before Start's thread can connect; not
  // removable.
  void AddOnConnected(std::function<void()> callback);
  // Runs `callback(why)` on the cluster's thread once per lease of this node that is lost:
  // etcd answered a keep-alive that it no longer has it (it expired while this node could not
  // reach etcd, or was revoked), so the other nodes saw this node's key go. Not while etcd is
  // merely unreachable: etcd keeps leases across its own outage, and a node cannot tell its own
  // partition from etcd's. Not at a clean Stop. Not removable.
  void AddOnLeaseLost(std::function<void(const std::string& why)> callback);

 private:
  Cluster(ClusterOptions options, prometheus::Registry* registry);
  void Run();
  // Grants a lease and writes the node key with it; fails if another live daemon holds the
  // node name.
  absl::Status Register();
  // One keep-alive round over the node's lease and the sources' leases.
  absl::Status Refresh();
  // The deadline of a lease keep-alive: call_timeout, at most a third of the lease TTL.
  absl::Duration KeepAliveTimeout() const;
  // Records and logs the state; true when it changed to connected.
  bool SetState(bool connected, const absl::Status& why);
  // Counts the live nodes' keys into commd_cluster_nodes (asynchronously).
  void CountNodes();
  // Sleeps up to `d`; false when stopping.
  bool Sleep(absl::Duration d);
  // The node's lease `lease` is gone: the callbacks hear it, once per lease.
  void LeaseLost(int64_t lease, const std::string& why);

  const ClusterOptions options_;
  EtcdClient etcd_;
  prometheus::Gauge* connected_gauge_;
  prometheus::Gauge* nodes_gauge_;
  std::shared_ptr<LeaseGauges> lease_gauges_;
  prometheus::Counter* keepalives_ok_;       // answered: the lease lives on
  prometheus::Counter* keepalives_failed_;   // no answer (etcd unreachable, the deadline)
  prometheus::Counter* keepalives_expired_;  // answered that the lease is gone
  prometheus::Counter* grants_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ ABSL_GUARDED_BY(mu_) = false;  // the first state has been logged
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time since_ ABSL_GUARDED_BY(mu_);
  std::vector<LeaseSource> sources_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> on_connected_ ABSL_GUARDED_BY(mu_);
  bool registered_anew_ = false;  // by the last Register (the cluster's thread only)
  std::vector<std::function<void(const std::string&)>> on_lease_lost_ ABSL_GUARDED_BY(mu_);
  int64_t lost_lease_ ABSL_GUARDED_BY(mu_) = 0;  // the last lease reported lost
  std::thread thread_;
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_CLUSTER_H_
