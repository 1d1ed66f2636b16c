// The daemon's Prometheus endpoint and the metrics every component shares.
//
//   ASSIGN_OR_RETURN(auto metrics, Metrics::Start("127.0.0.1:0", version));
//   metrics->RecordRpc("GetStatus", grpc::StatusCode::OK, absl::Microseconds(80));
//
// Naming follows Prometheus practice: prefix commd_, base units, _total on counters, and only
// bounded label values (method, code, reason; never ids or pids). Thread-safe.
#ifndef COMMD_DAEMON_METRICS_METRICS_H_
#define COMMD_DAEMON_METRICS_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "commd/v1/topology.pb.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace commd::metrics {

class Metrics {
 public:
  // Serves /metrics on `address` (HOST:PORT; port 0 picks a free one). Fails with the reason
  // when the address cannot be bound (in use, bad host).
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address,
                                                        const std::string& version);

  // "host:port" actually bound, e.g. "127.0.0.1:39211".
  const std::string& bound_address() const { return bound_address_; }
  prometheus::Registry& registry() { return *registry_; }
  // Serves `collectable` too; it must stay alive until the Metrics object is destroyed.
  void Register(const std::shared_ptr<prometheus::Collectable>& collectable) {
    exposer_->RegisterCollectable(collectable);
  }
  // Stops serving `collectable` (before what it reads is destroyed).
  void Unregister(const std::shared_ptr<prometheus::Collectable>& collectable) {
    exposer_->RemoveCollectable(collectable);
  }

  // One finished RPC: its latency, and an error count when `code` is not OK. `code` is the
  // numeric gRPC/absl status code.
  void RecordRpc(absl::string_view method, int code, absl::Duration latency);
  void SetSessions(double n) { sessions_->Set(n); }
  void SessionReleased(absl::string_view reason);
  // Replaces the topology gauges with `topology`.
  void SetTopology(const v1::Topology& topology);

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bound_address_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* rpc_errors_ = nullptr;
  prometheus::Family<prometheus::Counter>* sessions_released_ = nullptr;
  prometheus::Family<prometheus::Gauge>* topology_info_ = nullptr;
  prometheus::Family<prometheus::Gauge>* topology_link_ = nullptr;
  prometheus::Gauge* sessions_ = nullptr;
};

// Status code names as gRPC spells them ("OK", "UNAUTHENTICATED", ...).
absl::string_view CodeName(int code);

}  // namespace commd::metrics

#endif  // COMMD_DAEMON_METRICS_METRICS_H_
