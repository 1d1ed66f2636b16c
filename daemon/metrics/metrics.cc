#include "daemon/metrics/metrics.h"

#include <ctime>
#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/config/config.h"
#include "daemon/metrics/histograms.h"

namespace commd::metrics {
namespace {

// 50 µs to ~13 s: unix-socket RPCs sit at the low end, rendezvous at the high end.
prometheus::Histogram::BucketBoundaries RpcBuckets() { return GeometricBuckets(50e-6, 2, 20); }

}  // namespace

absl::string_view CodeName(int code) {
  static constexpr absl::string_view kNames[] = {"OK",
                                                 "CANCELLED",
                                                 "UNKNOWN",
                                                 "INVALID_ARGUMENT",
                                                 "DEADLINE_EXCEEDED",
                                                 "NOT_FOUND",
                                                 "ALREADY_EXISTS",
                                                 "PERMISSION_DENIED",
                                                 "RESOURCE_EXHAUSTED",
                                                 "FAILED_PRECONDITION",
                                                 "ABORTED",
                                                 "OUT_OF_RANGE",
                                                 "UNIMPLEMENTED",
                                                 "INTERNAL",
                                                 "UNAVAILABLE",
                                                 "DATA_LOSS",
                                                 "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) return "UNKNOWN";
  return kNames[code];
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address,
                                                        const std::string& version) {
  ASSIGN_OR_RETURN(config::HostPort hp, config::ParseHostPort(address));
  std::unique_ptr<Metrics> m(new Metrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  try {
    // civetweb spells an IPv6 listener "[::1]:port".
    const std::string listen = hp.host.find(':') != std::string::npos
                                   ? absl::StrCat("[", hp.host, "]:", hp.port)
                                   : absl::StrCat(hp.host, ":", hp.port);
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what(),
                     " (address in use or not local; set metrics_address or --metrics-address)"));
  }
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  m->bound_address_ = absl::StrCat(hp.host, ":", ports.empty() ? hp.port : ports.front());
  m->exposer_->RegisterCollectable(m->registry_);

  auto& reg = *m->registry_;
  prometheus::BuildGauge()
      .Name("commd_build_info")
      .Help("Build of the running daemon; always 1")
      .Register(reg)
      .Add({{"version", version}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("commd_start_time_seconds")
      .Help("Unix time the daemon started")
      .Register(reg)
      .Add({})
      .Set(static_cast<double>(std::time(nullptr)));
  m->sessions_ = &prometheus::BuildGauge()
                      .Name("commd_sessions")
                      .Help("Client sessions open")
                      .Register(reg)
                      .Add({});
  m->sessions_released_ = &prometheus::BuildCounter()
                               .Name("commd_sessions_released_total")
                               .Help("Sessions ended, by reason (closed, process_exited)")
                               .Register(reg);
  m->rpc_duration_ = &prometheus::BuildHistogram()
                          .Name("commd_rpc_duration_seconds")
                          .Help("Latency of gRPC calls served, by method")
                          .Register(reg);
  m->rpc_errors_ = &prometheus::BuildCounter()
                        .Name("commd_rpc_errors_total")
                        .Help("gRPC calls that failed, by method and status code")
                        .Register(reg);
  m->topology_info_ = &prometheus::BuildGauge()
                           .Name("commd_topology_info")
                           .Help("Node topology summary; always 1")
                           .Register(reg);
  m->topology_link_ = &prometheus::BuildGauge()
                           .Name("commd_topology_nvlinks")
                           .Help(
                               "NVLinks between two GPUs (0 for a PCIe/SMP path), "
                               "labelled with the nvidia-smi topo link type")
                           .Register(reg);
  return m;
}

void Metrics::RecordRpc(absl::string_view method, int code, absl::Duration latency) {
  const std::string m(method);
  rpc_duration_->Add({{"method", m}}, RpcBuckets()).Observe(absl::ToDoubleSeconds(latency));
  if (code != 0)
    rpc_errors_->Add({{"method", m}, {"code", std::string(CodeName(code))}}).Increment();
}

void Metrics::SessionReleased(absl::string_view reason) {
  sessions_released_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::SetTopology(const v1::Topology& topology) {
  topology_info_
      ->Add({{"classification", v1::TopologyClass_Name(topology.classification())},
             {"gpus", std::to_string(topology.gpus_size())},
             {"nics", std::to_string(topology.nics_size())},
             {"numa_nodes", std::to_string(topology.numa_nodes_size())}})
      .Set(1);
  for (int i = 0; i < topology.gpu_links_size(); ++i) {
    const auto& row = topology.gpu_links(i).links();
    for (int j = 0; j < row.size(); ++j) {
      if (i == j) continue;
      topology_link_
          ->Add({{"gpu", std::to_string(i)}, {"peer", std::to_string(j)}, {"type", row[j].label()}})
          .Set(row[j].nvlinks());
    }
  }
}

}  // namespace commd::metrics
