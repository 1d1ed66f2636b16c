// The running daemon: every component, started in order and stopped in reverse.
//
//   ASSIGN_OR_RETURN(auto daemon, Daemon::Start(config));   // sockets listening, metrics serving
//   ...
//   daemon->Shutdown();                                     // sockets removed
//
// main.cc owns process concerns (flags, signals, systemd); this class owns everything a test
// can build without a process. Start/Shutdown/Reload are called from one thread.
#ifndef COMMD_DAEMON_DAEMON_H_
#define COMMD_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/v1/config.pb.h"
#include "commd/v1/topology.pb.h"
#include "common/log.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/cluster_store.h"
#include "daemon/cluster/job_dumps.h"
#include "daemon/cluster/node_directory.h"
#include "daemon/cluster/progress.h"
#include "daemon/cluster/span_aborts.h"
#include "daemon/groups/group_registry.h"
#include "daemon/groups/groups_service.h"
#include "daemon/memory/allocation_table.h"
#include "daemon/memory/persistent_buffers.h"
#include "daemon/metrics/metrics.h"
#include "daemon/recorder/dumper.h"
#include "daemon/recorder/group_dumps.h"
#include "daemon/recorder/recorder_service.h"
#include "daemon/server/event_loop.h"
#include "daemon/server/grpc_connections.h"
#include "daemon/server/handle_channel.h"
#include "daemon/server/node_service.h"
#include "daemon/server/rpc.h"
#include "daemon/server/runtime_dir_lock.h"
#include "daemon/server/session_service.h"
#include "daemon/server/sessions.h"
#include "daemon/server/timer_queue.h"
#include "daemon/store/kv_store.h"
#include "daemon/store/node_store.h"
#include "daemon/store/store_service.h"
#include "daemon/watchdog/cluster_events.h"
#include "daemon/watchdog/health_service.h"
#include "daemon/watchdog/watchdog.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace commd {

// The daemon's version, as `commd --version` prints it.
const char* DaemonVersion();

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const v1::DaemonConfig& config);
  ~Daemon();

  // Stops accepting, ends in-flight calls (cancelled after `grace`), releases everything and
  // removes the sockets. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(3));

  // Applies what can change live: the log level.
  void Reload(const v1::DaemonConfig& config);

  // Dumps every formed group's flight recorders (SIGUSR1).
  void DumpAll(const std::string& trigger);

  const std::string& runtime_dir() const { return dir_->dir(); }
  const std::string& metrics_address() const { return metrics_->bound_address(); }

 private:
  Daemon() = default;
  absl::Status StartMemory();
  absl::Status StartServers();
  // With cluster.etcd_endpoints: the etcd connection and the job store it serves.
  absl::Status StartCluster(const store::StoreLimits& limits);
  // Bounds on what gRPC connections may cost: memory quota, streams, ping policy, idleness.
  void ConfigureGrpcTransport(grpc::ServerBuilder* builder);
  void FillStatus(v1::NodeStatus* status) const;

  v1::DaemonConfig config_;
  absl::Time start_time_;
  v1::Topology topology_;
  std::unique_ptr<server::RuntimeDirLock> dir_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<server::SessionRegistry> sessions_;
  std::unique_ptr<server::HandleChannel> channel_;
  std::unique_ptr<server::GrpcConnections> grpc_connections_;
  std::unique_ptr<memory::AllocationTable> table_;
  std::unique_ptr<groups::GroupRegistry> groups_;
  std::unique_ptr<groups::SpanRendezvous> span_;  // groups spanning nodes; null: single node
  std::unique_ptr<memory::PersistentBuffers> persistent_;
  std::unique_ptr<store::KvStore> store_;
  std::unique_ptr<cluster::Cluster> cluster_;             // null: single node
  std::unique_ptr<cluster::ClusterStore> cluster_store_;  // the job store when clustered
  std::unique_ptr<cluster::JobDumps> job_dumps_;          // one dump for a job across nodes
  std::unique_ptr<cluster::ProgressBoard> progress_;      // every node's view of a job
  std::unique_ptr<cluster::NodeDirectory> nodes_;         // the nodes, live and gone
  std::unique_ptr<cluster::SpanAborts> span_aborts_;      // aborts of groups across nodes
  std::unique_ptr<recorder::Dumper> dumper_;
  std::unique_ptr<recorder::GroupDumps> group_dumps_;  // every dump of groups goes through it
  std::unique_ptr<server::RpcContext> rpc_;
  std::unique_ptr<server::NodeService> node_service_;
  std::unique_ptr<server::SessionService> session_service_;
  std::unique_ptr<groups::GroupsService> groups_service_;
  std::unique_ptr<memory::MemoryService> memory_service_;
  std::unique_ptr<store::NodeStore> node_store_;  // the job store when not clustered
  std::unique_ptr<store::StoreService> store_service_;
  std::unique_ptr<recorder::RecorderService> recorder_service_;
  std::unique_ptr<watchdog::Watchdog> watchdog_;
  std::unique_ptr<watchdog::ClusterEvents> cluster_events_;  // null: single node
  std::unique_ptr<watchdog::HealthService> health_service_;
  std::unique_ptr<grpc::Server> grpc_;
  // Threads that call into the components above; Shutdown stops them first.
  std::unique_ptr<server::TimerQueue> timers_;
  std::unique_ptr<server::EventLoop> loop_;
};

// Maps the config's log level onto the logger's.
LogSeverity ToLogSeverity(v1::LogLevel level);

}  // namespace commd

#endif  // COMMD_DAEMON_DAEMON_H_
