#include "daemon/daemon.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cuda_driver.h"
#include "common/log.h"
#include "common/runtime_dir.h"
#include "common/status_macros.h"
#include "daemon/cluster/span_rendezvous.h"
#include "daemon/topology/topology.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"

namespace commd {

namespace {

std::string Hostname() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

const char* DaemonVersion() { return COMMD_VERSION; }

LogSeverity ToLogSeverity(v1::LogLevel level) {
  switch (level) {
    case v1::DEBUG:
      return LogSeverity::kDebug;
    case v1::WARNING:
      return LogSeverity::kWarning;
    case v1::ERROR:
      return LogSeverity::kError;
    default:
      return LogSeverity::kInfo;
  }
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const v1::DaemonConfig& config) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->config_ = config;
  d->start_time_ = absl::Now();
  const std::string dir = config.runtime_dir().empty() ? DefaultRuntimeDir() : config.runtime_dir();
  ASSIGN_OR_RETURN(gid_t socket_gid, server::LookupGroup(config.socket_group(), "socket_group"));
  ASSIGN_OR_RETURN(gid_t admin_gid, server::LookupGroup(config.admin_group(), "admin_group"));
  // The lock comes first, so a second daemon names the first instead of failing on a port.
  ASSIGN_OR_RETURN(d->dir_, server::RuntimeDirLock::Acquire(dir, socket_gid));
  ASSIGN_OR_RETURN(d->metrics_, metrics::Metrics::Start(config.metrics_address(), DaemonVersion()));
  COMMD_LOG(INFO, "metrics") << "serving http://" << d->metrics_->bound_address() << "/metrics";

  const CudaDriverInfo& cuda = ProbeCudaDriver();
  if (cuda.below_floor) {
    COMMD_LOG(WARNING, "cuda") << cuda.summary << "; host memory backend only";
  } else {
    COMMD_LOG(INFO, "cuda") << cuda.summary << (cuda.available ? "" : "; host memory backend only");
  }
  d->topology_ = topology::DiscoverTopology(config.topology());
  d->metrics_->SetTopology(d->topology_);
  COMMD_LOG(INFO, "topology") << d->topology_.pus() << " CPUs, " << d->topology_.numa_nodes_size()
                              << " NUMA node(s), " << d->topology_.gpus_size() << " GPU(s), "
                              << d->topology_.nics_size() << " NIC(s), GPUs: "
                              << v1::TopologyClass_Name(d->topology_.classification())
                              << ", NVML: " << d->topology_.nvml_status();

  ASSIGN_OR_RETURN(d->loop_, server::EventLoop::Create());
  d->timers_ = std::make_unique<server::TimerQueue>();
  d->sessions_ = std::make_unique<server::SessionRegistry>(
      d->loop_.get(), d->timers_.get(), d->metrics_.get(),
      server::SessionLimits{.max_sessions = config.limits().max_sessions(),
                            .max_sessions_per_uid = config.limits().per_uid().sessions(),
                            .admin_gid = admin_gid});
  RETURN_IF_ERROR(d->StartMemory());
  RETURN_IF_ERROR(d->StartServers());
  return d;
}

absl::Status Daemon::StartMemory() {
  ASSIGN_OR_RETURN(auto host, memory::CreateHostMemoryBackend());
  std::unique_ptr<memory::MemoryBackend> cuda;
  if (auto backend = memory::CreateCudaMemoryBackend(); backend.ok()) {
    cuda = *std::move(backend);
  } else {
    COMMD_LOG(INFO, "memory") << "no GPU memory backend: " << backend.status().message();
  }
  table_ = std::make_unique<memory::AllocationTable>(std::move(host), std::move(cuda), config_,
                                                     &metrics_->registry());
  groups::GroupsOptions options;
  options.default_timeout = absl::Milliseconds(config_.groups().default_timeout_ms());
  options.max_timeout = absl::Milliseconds(config_.groups().max_timeout_ms());
  options.release_grace = absl::Milliseconds(config_.session().release_grace_ms());
  const v1::PerUidLimits& per_uid = config_.limits().per_uid();
  options.max_groups = config_.limits().max_groups();
  options.max_groups_forming_per_uid = per_uid.groups_forming();
  options.ring_capacity = config_.recorder().ring_capacity();
  const v1::CollectivesConfig& coll = config_.collectives();
  options.collectives.set_one_shot_max_read_bytes(coll.one_shot_max_read_bytes());
  options.collectives.set_nan_check(coll.nan_check());
  options.collectives.set_nan_sample_period(coll.nan_sample_period());
  options.collectives.set_nan_policy(coll.nan_policy());
  dumper_ = std::make_unique<recorder::Dumper>(
      recorder::DumperOptions{.dump_dir = config_.recorder().dump_dir().empty()
                                              ? recorder::DefaultDumpDir()
                                              : config_.recorder().dump_dir(),
                              .host = Hostname(),
                              .version = DaemonVersion(),
                              .write_torch_pickle = config_.recorder().write_torch_pickle(),
                              .dumps_per_minute = per_uid.dumps_per_minute(),
                              .dump_burst = per_uid.dump_burst(),
                              .dump_bytes_per_uid = per_uid.dump_bytes()},
      &metrics_->registry());
  COMMD_LOG(INFO, "recorder") << "dumps go to " << dumper_->dump_dir();
  // The watchdog aborts the dead rank's group (under every policy) and writes the one dump.
  options.on_rank_death = [this](const groups::RankDeath& death) {
    if (watchdog_ != nullptr) {
      watchdog_->OnRankDeath(death);
    } else {
      (void)group_dumps_->DumpGroups(death.group, "rank_death", std::nullopt);
    }
  };
  // The watchdog starts with the servers (it pushes on Attach streams); no group can time out
  // its rendezvous before clients can join.
  options.on_rendezvous_timeout = [this](const groups::GroupSnapshot& g, std::vector<int> joined,
                                         std::vector<int> missing) {
    if (watchdog_ != nullptr) watchdog_->OnRendezvousTimeout(g, joined, missing);
  };
  groups_ = std::make_unique<groups::GroupRegistry>(options, table_.get(), timers_.get(),
                                                    &metrics_->registry());
  group_dumps_ = std::make_unique<recorder::GroupDumps>(groups_.get(), dumper_.get());
  persistent_ =
      std::make_unique<memory::PersistentBuffers>(table_.get(), timers_.get(), config_.memory());
  const store::StoreLimits store_limits{
      .max_keys_per_job = config_.limits().max_store_keys_per_job(),
      .max_key_bytes = config_.limits().max_store_key_bytes(),
      .max_value_bytes = config_.limits().max_store_value_bytes(),
      .max_bytes_per_job = config_.limits().max_store_bytes_per_job(),
      .max_bytes = config_.limits().max_store_bytes(),
      .max_keys_per_uid = per_uid.store_keys(),
      .max_bytes_per_uid = per_uid.store_bytes(),
      .max_wait = absl::Milliseconds(config_.groups().max_timeout_ms())};
  store_ = std::make_unique<store::KvStore>(store_limits, timers_.get());
  if (config_.cluster().etcd_endpoints_size() > 0) RETURN_IF_ERROR(StartCluster(store_limits));
  sessions_->AddEndListener([this](const server::Session& s, const server::SessionEnd& end) {
    groups_->OnSessionEnd(s, end);
    persistent_->OnSessionEnd(s);
    if (cluster_store_ != nullptr) cluster_store_->OnSessionEnd(s);
  });
  return absl::OkStatus();
}

absl::Status Daemon::StartCluster(const store::StoreLimits& limits) {
  ASSIGN_OR_RETURN(cluster::ClusterOptions options,
                   cluster::ClusterOptionsFromConfig(config_.cluster(), Hostname()));
  // "owner" first: Cluster tells a restart of this daemon from another daemon by it.
  options.node_info = absl::StrCat("{\"owner\":\"", Hostname(), ":", dir_->dir(),
                                   "\",\"pid\":", ::getpid(), ",\"version\":\"", DaemonVersion(),
                                   "\",\"metrics\":\"", metrics_->bound_address(), "\"}");
  COMMD_LOG(INFO, "cluster") << "node " << options.node_name
                             << " joins the cluster through etcd at "
                             << absl::StrJoin(options.endpoints, ", ")
                             << (options.tls.has_value() ? " (TLS)" : "") << " under "
                             << options.prefix;
  cluster_ = cluster::Cluster::Start(std::move(options), &metrics_->registry());
  metrics_->Register(cluster_->lease_gauges());
  // Groups that span nodes rendezvous through etcd (docs/cluster.md).
  span_ = std::make_unique<cluster::EtcdSpanRendezvous>(
      cluster_.get(), config_.limits().per_uid().spanning_groups());
  groups_->set_span_rendezvous(span_.get());
  cluster_store_ = std::make_unique<cluster::ClusterStore>(
      cluster_.get(), limits, absl::Milliseconds(config_.cluster().job_lease_ttl_ms()),
      timers_.get());
  // One dump for a job across its nodes: this node's dumps of one job are announced, and the
  // other nodes' announcements dump this node's ranks of the job (queued, charged to the uid).
  job_dumps_ = std::make_unique<cluster::JobDumps>(
      cluster_.get(), cluster::JobDumpsOptions{},
      [this](const cluster::RemoteDump& d) {
        auto r = group_dumps_->DumpGroups(
            groups::GroupSelector{.job = std::make_pair(d.uid, d.job_id), .group = d.group},
            d.trigger, d.diagnosis, {.shared_id = d.dump_id, .local_only = true});
        if (r.ok()) {
          COMMD_LOG(INFO, "recorder") << "dumping job " << d.job_id << " under " << d.dump_id
                                      << " (" << d.trigger << " on node " << d.node << ")";
        } else if (!absl::IsNotFound(r.status()) &&       // no ranks of that job here
                   !absl::IsAlreadyExists(r.status())) {  // this node found it too
          COMMD_LOG(WARNING, "recorder") << "dump " << d.dump_id << " of job " << d.job_id
                                         << " from node " << d.node << ": " << r.status();
        }
      },
      &metrics_->registry());
  group_dumps_->set_publisher(job_dumps_.get());
  // Every node's view of a job's groups: the watchdog writes this node's, health reads them.
  progress_ = std::make_unique<cluster::ProgressBoard>(cluster_.get(), &metrics_->registry());
  // An abort of a spanning group on one node aborts it on every node: the watchdog announces,
  // and the watch (started with the watchdog) applies the other nodes' announcements.
  span_aborts_ = std::make_unique<cluster::SpanAborts>(cluster_.get(), cluster::SpanAbortsOptions{},
                                                       &metrics_->registry());
  return absl::OkStatus();
}

absl::Status Daemon::StartServers() {
  const v1::TransportConfig& transport = config_.transport();
  auto accept = [&](std::string path, uint32_t max_connections) {
    return server::AcceptorOptions{.path = std::move(path),
                                   .max_connections = max_connections,
                                   .max_per_uid = config_.limits().per_uid().fd_connections(),
                                   .backoff = absl::Milliseconds(transport.accept_backoff_ms())};
  };
  server::HandleChannelOptions channel_options;
  channel_options.accept = accept(dir_->handle_socket(), transport.max_fd_connections());
  channel_options.session_timeout = absl::Milliseconds(transport.session_timeout_ms());
  channel_options.daemon_version = DaemonVersion();
  channel_options.importer = [table = table_.get()](
                                 const std::vector<std::string>& tokens,
                                 pid_t pid) -> absl::StatusOr<std::vector<server::ImportedFd>> {
    ASSIGN_OR_RETURN(auto redeemed, table->Redeem(tokens, pid));
    std::vector<server::ImportedFd> out;
    for (auto& r : redeemed) out.push_back({std::move(r.fd), r.bytes});
    return out;
  };
  ASSIGN_OR_RETURN(channel_, server::HandleChannel::Start(channel_options, loop_.get(),
                                                          sessions_.get(), &metrics_->registry()));
  RETURN_IF_ERROR(dir_->SecureSocket(dir_->handle_socket()));
  ASSIGN_OR_RETURN(
      grpc_connections_,
      server::GrpcConnections::Start(
          {.accept = accept(dir_->grpc_socket(), transport.max_grpc_connections()),
           .session_timeout = absl::Milliseconds(transport.session_timeout_ms()),
           .write_stall_timeout = absl::Milliseconds(transport.write_stall_timeout_ms())},
          loop_.get(), &metrics_->registry()));

  rpc_ = std::make_unique<server::RpcContext>(sessions_.get(), metrics_.get(),
                                              grpc_connections_.get());
  node_service_ = std::make_unique<server::NodeService>(
      rpc_.get(), [this](v1::NodeStatus* s) { FillStatus(s); }, [this] { return topology_; },
      [this](const v1::ListClusterNodesRequest& request)
          -> absl::StatusOr<v1::ListClusterNodesResponse> {
        if (nodes_ == nullptr) {
          return absl::FailedPreconditionError(
              "this daemon is not in a cluster (no cluster.etcd_endpoints): it has no nodes to "
              "list");
        }
        return nodes_->List(request);
      });
  grpc::ServerBuilder builder;
  // No listening port: GrpcConnections accepts on commd.sock and hands each connection over.
  ConfigureGrpcTransport(&builder);
  session_service_ = std::make_unique<server::SessionService>(rpc_.get(), sessions_.get());
  groups_service_ = std::make_unique<groups::GroupsService>(rpc_.get(), groups_.get());
  memory_service_ = std::make_unique<memory::MemoryService>(rpc_.get(), persistent_.get());
  builder.RegisterService(node_service_.get());
  builder.RegisterService(session_service_.get());
  builder.RegisterService(groups_service_.get());
  builder.RegisterService(memory_service_.get());
  // One store per job: the node's own, or with a cluster the one in etcd (never both, so a
  // disconnected cluster fails store calls instead of splitting the job's keys).
  store::StoreBackend* job_store = cluster_store_.get();
  if (job_store == nullptr) {
    node_store_ = std::make_unique<store::NodeStore>(store_.get(), &metrics_->registry());
    job_store = node_store_.get();
  }
  store_service_ = std::make_unique<store::StoreService>(rpc_.get(), job_store);
  builder.RegisterService(store_service_.get());
  recorder_service_ = std::make_unique<recorder::RecorderService>(rpc_.get(), group_dumps_.get());
  builder.RegisterService(recorder_service_.get());
  const v1::WatchdogConfig& wd = config_.watchdog();
  watchdog_ = std::make_unique<watchdog::Watchdog>(
      watchdog::WatchdogOptions{
          .poll_interval = absl::Milliseconds(wd.poll_interval_ms()),
          .heartbeat_timeout = absl::Milliseconds(wd.heartbeat_timeout_ms()),
          .max_timeout = absl::Milliseconds(wd.max_collective_timeout_ms()),
          .policy = wd.policy(),
          .terminate_grace = absl::Milliseconds(wd.terminate_grace_ms()),
          .progress = progress_.get(),
          .progress_period = absl::Milliseconds(config_.cluster().progress_interval_ms()),
          .aborts = span_aborts_.get()},
      groups_.get(), group_dumps_.get(),
      [service = session_service_.get()](const std::string& token, const v1::SessionEvent& e) {
        return service->Push(token, e);
      },
      &metrics_->registry(), NewRealtimeRecorderClock());
  metrics_->Register(watchdog_->group_metrics());
  watchdog_->Start();
  if (cluster_ != nullptr) {
    cluster_events_ = std::make_unique<watchdog::ClusterEvents>(watchdog_.get(), groups_.get());
    // The nodes as etcd lists them, for ListClusterNodes. A node's key goes when its daemon's
    // lease ends (killed, cut off from etcd past the TTL, or stopped): the groups spanning it
    // are lost on this node too.
    nodes_ = std::make_unique<cluster::NodeDirectory>(
        cluster_.get(), [this](const std::string& node, int64_t revision, absl::string_view why) {
          cluster_events_->OnNodeGone(node, revision, why);
        });
    span_aborts_->Watch(
        [this](const watchdog::SpanAbortNotice& a) { return cluster_events_->OnRemoteAbort(a); });
    // This node's own lease gone: the other nodes dropped it from every group spanning it.
    cluster_->AddOnLeaseLost([this](const std::string& why) { cluster_events_->OnLeaseLost(why); });
  }
  health_service_ =
      std::make_unique<watchdog::HealthService>(rpc_.get(), watchdog_.get(), progress_.get());
  builder.RegisterService(health_service_.get());
  // Further services register here, each built from rpc_ and its own component.
  grpc_ = builder.BuildAndStart();
  if (grpc_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", dir_->grpc_socket()));
  }
  grpc_connections_->Serve(grpc_.get());
  RETURN_IF_ERROR(dir_->SecureSocket(dir_->grpc_socket()));
  COMMD_LOG(INFO, "server") << "gRPC on " << dir_->grpc_socket() << ", fd channel on "
                            << dir_->handle_socket();
  return absl::OkStatus();
}

void Daemon::ConfigureGrpcTransport(grpc::ServerBuilder* builder) {
  const v1::TransportConfig& t = config_.transport();
  builder->SetMaxReceiveMessageSize(static_cast<int>(config_.limits().max_message_bytes()));
  // Every connection's buffers come out of one quota, so no number of clients can grow the
  // daemon past it; over it gRPC stops reading rather than allocating.
  grpc::ResourceQuota quota("commd-transport");
  quota.Resize(t.grpc_memory_bytes());
  quota.SetMaxThreads(static_cast<int>(t.grpc_max_threads()));
  builder->SetResourceQuota(quota);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              static_cast<int>(t.max_streams_per_connection()));
  // No ping strikes. gRPC 1.51 answers a strike-out by deferring the close until its pending
  // writes finish, which never happens when the peer does not read, and meanwhile keeps one
  // more error per further PING: the 850 MB of the PING flood. GrpcConnections closes such
  // a peer instead (write_stall_timeout_ms), and acks alone cost the daemon a few bytes.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              static_cast<int>(t.max_connection_idle_ms()));
}

void Daemon::FillStatus(v1::NodeStatus* status) const {
  status->set_version(DaemonVersion());
  status->set_hostname(Hostname());
  status->set_pid(::getpid());
  status->set_start_time_unix_ms(absl::ToUnixMillis(start_time_));
  status->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - start_time_));
  status->set_sessions(static_cast<uint32_t>(sessions_->size()));
  status->set_groups(static_cast<uint32_t>(groups_->size()));
  status->set_memory_allocated_bytes(table_->total_bytes());
  status->set_runtime_dir(dir_->dir());
  status->set_metrics_address(metrics_->bound_address());
  const CudaDriverInfo& cuda = ProbeCudaDriver();
  status->set_cuda_status(cuda.summary);
  status->set_cuda_driver_version(cuda.driver_version);
  status->set_cuda_driver_floor(cuda.driver_floor);
  status->set_cuda_driver_below_floor(cuda.below_floor);
  if (cluster_ != nullptr) cluster_->FillStatus(status->mutable_cluster());
}

void Daemon::Reload(const v1::DaemonConfig& config) {
  SetMinLogLevel(ToLogSeverity(config.log_level()));
  config_.set_log_level(config.log_level());
  COMMD_LOG_ALWAYS("daemon") << "reloaded: log level " << v1::LogLevel_Name(config.log_level());
}

void Daemon::DumpAll(const std::string& trigger) {
  auto r = group_dumps_->DumpGroups(groups::GroupSelector{}, trigger, std::nullopt, {.now = true});
  if (absl::IsNotFound(r.status())) {
    COMMD_LOG(INFO, "recorder") << trigger << ": no formed group to dump";
  } else if (!r.ok()) {
    COMMD_LOG(WARNING, "recorder") << trigger << " dump failed: " << r.status();
  }
}

void Daemon::Shutdown(absl::Duration grace) {
  if (grpc_connections_ != nullptr) grpc_connections_->Stop();
  if (grpc_ != nullptr) {
    grpc_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
    grpc_.reset();
  }
  // Stop the threads that call into components before destroying any component; scrapes
  // read the groups' control blocks, so they stop first.
  if (watchdog_ != nullptr) watchdog_->Stop();
  if (watchdog_ != nullptr && metrics_ != nullptr) metrics_->Unregister(watchdog_->group_metrics());
  if (span_ != nullptr) span_->Shutdown();  // the spanning groups' waits, before etcd goes
  // The cluster's waits end and its etcd calls drain before the timers and sessions go.
  if (nodes_ != nullptr) nodes_->Stop();              // it calls into cluster_events_
  if (span_aborts_ != nullptr) span_aborts_->Stop();  // so does its watch
  if (job_dumps_ != nullptr) {
    group_dumps_->set_publisher(nullptr);
    job_dumps_->Stop();
  }
  if (cluster_store_ != nullptr) cluster_store_->Shutdown();
  if (cluster_ != nullptr) cluster_->Stop();
  loop_.reset();
  timers_.reset();
  recorder_service_.reset();
  health_service_.reset();
  cluster_events_.reset();  // the cluster's callbacks into it stopped with the cluster
  watchdog_.reset();
  store_service_.reset();
  node_store_.reset();
  memory_service_.reset();
  groups_service_.reset();
  session_service_.reset();
  node_service_.reset();
  group_dumps_.reset();
  groups_.reset();
  span_.reset();  // after the groups, which hold its waits
  persistent_.reset();
  store_.reset();
  cluster_store_.reset();
  job_dumps_.reset();
  span_aborts_.reset();
  progress_.reset();
  nodes_.reset();  // after Cluster::Stop: a read's answer calls back into it
  cluster_.reset();
  dumper_.reset();
  table_.reset();
  channel_.reset();
  grpc_connections_.reset();
  sessions_.reset();
  dir_.reset();  // removes the sockets
  metrics_.reset();
}

Daemon::~Daemon() { Shutdown(); }

}  // namespace commd
