#include "daemon/cluster/cluster.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "prometheus/metric_family.h"

namespace commd::cluster {

// The node's lease as etcd last answered about it; what is left of it is computed when asked,
// so a scrape while etcd does not answer sees it run out.
class LeaseGauges final : public prometheus::Collectable {
 public:
  // The grant, or an answered keep-alive: lease `id`, granted `granted` seconds, `left` left now.
  void Answered(int64_t id, int64_t granted, int64_t left) {
    absl::MutexLock lock(&mu_);
    state_ = {.id = id, .ttl_seconds = granted, .remaining_seconds = static_cast<double>(left)};
    at_ = absl::Now();
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    state_ = {};
  }
  LeaseState State() const {
    absl::MutexLock lock(&mu_);
    LeaseState s = state_;
    s.remaining_seconds =
        std::max(0.0, s.remaining_seconds - absl::ToDoubleSeconds(absl::Now() - at_));
    return s;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    const LeaseState s = State();
    auto gauge = [](const char* name, const char* help, double value) {
      prometheus::MetricFamily f{name, help, prometheus::MetricType::Gauge, {}};
      f.metric.emplace_back();
      f.metric.back().gauge.value = value;
      return f;
    };
    return {gauge("commd_cluster_lease_ttl_seconds",
                  "TTL etcd granted the node's lease (0 while the node holds none)",
                  static_cast<double>(s.ttl_seconds)),
            gauge("commd_cluster_lease_remaining_seconds",
                  "Seconds left of the node's lease: what etcd's last answer left of it, less the "
                  "time since (0 while the node holds none)",
                  s.remaining_seconds)};
  }

 private:
  mutable absl::Mutex mu_;
  LeaseState state_ ABSL_GUARDED_BY(mu_);
  absl::Time at_ ABSL_GUARDED_BY(mu_);
};

namespace {

// The part of the node's value that names the daemon holding it: one daemon per runtime dir
// on a host (the runtime dir lock), so the same owner is a restart of the same daemon.
std::string OwnerOf(const std::string& node_info) {
  const size_t end = node_info.find("\",");
  return end == std::string::npos ? node_info : node_info.substr(0, end);
}

}  // namespace

int64_t LeaseSeconds(absl::Duration ttl) {
  return std::max<int64_t>(1, absl::ToInt64Milliseconds(ttl + absl::Milliseconds(999)) / 1000);
}

namespace {

// The PEM text of TLS file `field` ("cluster.tls.ca_file") at `path`; "" for no path.
absl::StatusOr<std::string> ReadPem(const char* field, const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", path, "\" cannot be read: ", std::strerror(errno)));
  }
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " \"", path, "\" holds no PEM block (allowed: a PEM file, -----BEGIN ...)"));
  }
  return text;
}

}  // namespace

absl::StatusOr<ClusterOptions> ClusterOptionsFromConfig(const v1::ClusterConfig& config,
                                                        const std::string& hostname) {
  ClusterOptions o;
  if (config.tls().enabled()) {
    const v1::EtcdTlsConfig& t = config.tls();
    if (t.cert_file().empty() != t.key_file().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cluster.tls: cert_file \"", t.cert_file(),
                                                     "\" and key_file \"", t.key_file(),
                                                     "\" go together (allowed: both or neither)"));
    }
    EtcdTls tls{.server_name = t.server_name()};
    ASSIGN_OR_RETURN(tls.ca_pem, ReadPem("cluster.tls.ca_file", t.ca_file()));
    ASSIGN_OR_RETURN(tls.cert_pem, ReadPem("cluster.tls.cert_file", t.cert_file()));
    ASSIGN_OR_RETURN(tls.key_pem, ReadPem("cluster.tls.key_file", t.key_file()));
    o.tls = std::move(tls);
  }
  o.endpoints.assign(config.etcd_endpoints().begin(), config.etcd_endpoints().end());
  o.node_name = config.node_name().empty() ? hostname : config.node_name();
  o.prefix = config.prefix();
  o.lease_ttl = absl::Milliseconds(config.lease_ttl_ms());
  o.call_timeout = absl::Milliseconds(config.call_timeout_ms());
  o.retry_initial = absl::Milliseconds(config.retry_initial_ms());
  o.retry_max = std::max(o.retry_initial, absl::Milliseconds(config.retry_max_ms()));
  if (config.has_keepalive_ms()) o.keepalive = absl::Milliseconds(config.keepalive_ms());
  return o;
}

Cluster::Cluster(ClusterOptions options, prometheus::Registry* registry)
    : options_(std::move(options)),
      etcd_(EtcdOptions{.endpoints = options_.endpoints,
                        .tls = options_.tls,
                        .call_timeout = options_.call_timeout,
                        .reconnect_initial = options_.retry_initial,
                        .reconnect_max = options_.retry_max,
                        .keepalive = options_.keepalive}) {
  connected_gauge_ = &prometheus::BuildGauge()
                          .Name("commd_cluster_connected")
                          .Help("1 while the daemon holds its lease in the cluster's etcd")
                          .Register(*registry)
                          .Add({});
  nodes_gauge_ = &prometheus::BuildGauge()
                      .Name("commd_cluster_nodes")
                      .Help(
                          "Live nodes (daemons holding their lease) this daemon last counted "
                          "in etcd, about every 10 keep-alive beats")
                      .Register(*registry)
                      .Add({});
  lease_gauges_ = std::make_shared<LeaseGauges>();
  auto& keepalives = prometheus::BuildCounter()
                         .Name("commd_cluster_lease_keepalives_total")
                         .Help(
                             "Keep-alives of the node's lease: answered (ok), unanswered (failed: "
                             "etcd unreachable or past cluster.call_timeout_ms), answered that "
                             "the lease is gone (expired)")
                         .Register(*registry);
  keepalives_ok_ = &keepalives.Add({{"result", "ok"}});
  keepalives_failed_ = &keepalives.Add({{"result", "failed"}});
  keepalives_expired_ = &keepalives.Add({{"result", "expired"}});
  grants_ = &prometheus::BuildCounter()
                 .Name("commd_cluster_lease_grants_total")
                 .Help("Leases etcd granted the node: its first, and one after each lease lost")
                 .Register(*registry)
                 .Add({});
  since_ = absl::Now();
}

absl::Duration Cluster::KeepAliveTimeout() const {
  // Refreshed every third of the TTL: a keep-alive that takes at most another third leaves the
  // last third for a retry before the lease ends, however slow call_timeout_ms allows a call to be.
  return std::min(options_.call_timeout, options_.lease_ttl / 3);
}

std::unique_ptr<Cluster> Cluster::Start(ClusterOptions options, prometheus::Registry* registry) {
  std::unique_ptr<Cluster> c(new Cluster(std::move(options), registry));
  if (const absl::Duration t = c->KeepAliveTimeout(); t < c->options_.call_timeout) {
    COMMD_LOG(INFO, "cluster") << "lease keep-alives time out after " << absl::FormatDuration(t)
                               << ", a third of cluster.lease_ttl_ms "
                               << absl::ToInt64Milliseconds(c->options_.lease_ttl)
                               << ", less than cluster.call_timeout_ms "
                               << absl::ToInt64Milliseconds(c->options_.call_timeout)
                               << ": one slow keep-alive leaves time for a retry before the "
                                  "lease ends";
  }
  c->thread_ = std::thread([c = c.get()] { c->Run(); });
  return c;
}

Cluster::~Cluster() { Stop(); }

void Cluster::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    lease = std::exchange(lease_, 0);
  }
  // A clean stop takes the node out at once instead of after the lease's TTL.
  if (lease != 0) (void)etcd_.LeaseRevokeSync(lease);
  lease_gauges_->Clear();
  etcd_.Shutdown();
}

bool Cluster::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

int64_t Cluster::lease_id() const {
  absl::MutexLock lock(&mu_);
  return connected_ ? lease_ : 0;
}

absl::Status Cluster::Unavailable() const {
  absl::MutexLock lock(&mu_);
  return absl::UnavailableError(
      absl::StrCat("the cluster is disconnected (etcd at ", etcd_.endpoint(),
                   "): ", last_error_.empty() ? "not connected yet" : last_error_));
}

void Cluster::FillStatus(v1::ClusterStatus* status) const {
  absl::MutexLock lock(&mu_);
  status->set_state(connected_ ? "connected" : "disconnected");
  status->set_node_name(options_.node_name);
  status->set_endpoint(etcd_.endpoint());
  status->set_lease_id(connected_ ? lease_ : 0);
  status->set_last_error(connected_ ? "" : last_error_);
  status->set_state_since_unix_ms(absl::ToUnixMillis(since_));
}

std::string Cluster::NodeKey() const {
  return absl::StrCat(options_.prefix, "/nodes/", options_.node_name);
}

void Cluster::AddLeaseSource(LeaseSource source) {
  absl::MutexLock lock(&mu_);
  sources_.push_back(std::move(source));
}

void Cluster::CountNodes() {
  // A serializable count: the member's own copy, no raft round; exactness is not needed.
  const std::string prefix = options_.prefix + "/nodes/";
  pb::RangeRequest range;
  range.set_key(prefix);
  range.set_range_end(PrefixEnd(prefix));
  range.set_count_only(true);
  range.set_serializable(true);
  etcd_.Range(range, [gauge = nodes_gauge_](absl::StatusOr<pb::RangeResponse> r) {
    if (r.ok()) gauge->Set(static_cast<double>(r->count()));
  });
}

int64_t Cluster::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

LeaseState Cluster::lease_state() const { return lease_gauges_->State(); }

std::shared_ptr<prometheus::Collectable> Cluster::lease_gauges() const { return lease_gauges_; }

void Cluster::AddOnConnected(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  on_connected_.push_back(std::move(callback));
}

void Cluster::AddOnLeaseLost(std::function<void(const std::string&)> callback) {
  absl::MutexLock lock(&mu_);
  on_lease_lost_.push_back(std::move(callback));
}

void Cluster::LeaseLost(int64_t lease, const std::string& why) {
  std::vector<std::function<void(const std::string&)>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (lease == 0 || lost_lease_ == lease) return;
    lost_lease_ = lease;
    callbacks = on_lease_lost_;
  }
  COMMD_LOG(WARNING, "cluster") << "node " << options_.node_name << " lost its lease " << lease
                                << ": " << why;
  for (auto& f : callbacks) f(why);
}

bool Cluster::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return !stopping_;
}

void Cluster::Run() {
  absl::Duration backoff = options_.retry_initial;
  uint64_t beats = 0;
  // Three refreshes per TTL: one lost beat does not lose the lease.
  const absl::Duration beat = std::max(absl::Milliseconds(100), options_.lease_ttl / 3);
  while (true) {
    bool registered;
    {
      absl::MutexLock lock(&mu_);
      registered = lease_ != 0;
    }
    registered_anew_ = false;
    const absl::Status s = registered ? Refresh() : Register();
    if (SetState(s.ok(), s) || (s.ok() && registered_anew_)) {
      std::vector<std::function<void()>> callbacks;
      {
        absl::MutexLock lock(&mu_);
        callbacks = on_connected_;
      }
      for (auto& f : callbacks) f();
    }
    if (s.ok() && beats++ % 10 == 0) CountNodes();
    if (s.ok()) {
      backoff = options_.retry_initial;
      if (!Sleep(beat)) return;
      continue;
    }
    if (!Sleep(backoff)) return;
    backoff = std::min(backoff * 2, options_.retry_max);
  }
}

absl::Status Cluster::Register() {
  ASSIGN_OR_RETURN(pb::LeaseGrantResponse granted,
                   etcd_.LeaseGrantSync(LeaseSeconds(options_.lease_ttl)));
  if (!granted.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", etcd_.endpoint(), " refused a lease: ", granted.error()));
  }
  const std::string key = NodeKey();
  // The node's value says its lease's TTL too: the other nodes list it (ListClusterNodes)
  // without asking etcd about each lease.
  std::string value = options_.node_info;
  if (absl::EndsWith(value, "}")) {
    value.insert(value.size() - 1, absl::StrCat(",\"lease_ttl_s\":", granted.ttl()));
  }
  // Write the node key unless another daemon holds it; a restart of this same daemon (same
  // owner) takes it over from its old lease.
  pb::TxnRequest txn;
  pb::Compare* absent = txn.add_compare();
  absent->set_key(key);
  absent->set_target(pb::Compare::VERSION);
  absent->set_result(pb::Compare::EQUAL);
  absent->set_version(0);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(granted.id());
  txn.add_failure()->mutable_request_range()->set_key(key);
  absl::StatusOr<pb::TxnResponse> r = etcd_.TxnSync(txn);
  if (r.ok() && !r->succeeded()) {
    const auto& kvs = r->responses(0).response_range().kvs();
    if (!kvs.empty() && OwnerOf(kvs[0].value()) != OwnerOf(options_.node_info)) {
      (void)etcd_.LeaseRevokeSync(granted.id());
      return absl::AlreadyExistsError(
          absl::StrCat("node name ", QuoteForError(options_.node_name), " is held in etcd at ",
                       etcd_.endpoint(), " by another daemon (", QuoteForError(kvs[0].value()),
                       "); give each node its own cluster.node_name"));
    }
    pb::TxnRequest takeover;
    *takeover.add_success() = txn.success(0);
    r = etcd_.TxnSync(takeover);
  }
  if (!r.ok()) {
    (void)etcd_.LeaseRevokeSync(granted.id());
    return r.status();
  }
  {
    absl::MutexLock lock(&mu_);
    lease_ = granted.id();
  }
  grants_->Increment();
  lease_gauges_->Answered(granted.id(), granted.ttl(), granted.ttl());
  registered_anew_ = true;
  return absl::OkStatus();
}

absl::Status Cluster::Refresh() {
  std::vector<int64_t> ids;
  std::vector<LeaseSource> sources;
  {
    absl::MutexLock lock(&mu_);
    ids.push_back(lease_);
    sources = sources_;
  }
  for (const LeaseSource& source : sources) {
    for (int64_t id : source.ids()) ids.push_back(id);
  }
  absl::StatusOr<std::vector<int64_t>> answered = etcd_.KeepAliveSync(ids, KeepAliveTimeout());
  if (!answered.ok()) {
    keepalives_failed_->Increment();  // what is left of the lease keeps running out
    return answered.status();
  }
  const std::vector<int64_t>& ttls = *answered;
  for (size_t i = 1; i < ids.size(); ++i) {
    for (const LeaseSource& source : sources) source.refreshed(ids[i], ttls[i]);
  }
  if (ttls[0] > 0) {
    keepalives_ok_->Increment();
    const int64_t granted = lease_gauges_->State().ttl_seconds;
    lease_gauges_->Answered(ids[0], std::max(granted, ttls[0]), ttls[0]);
    return absl::OkStatus();
  }
  keepalives_expired_->Increment();
  lease_gauges_->Clear();
  // The lease expired while etcd was out of reach, was revoked, or etcd lost its data: the
  // other nodes saw this node's key go. Register anew.
  {
    absl::MutexLock lock(&mu_);
    lease_ = 0;
  }
  LeaseLost(ids[0], absl::StrCat("etcd at ", etcd_.endpoint(),
                                 " no longer has it: it expired while this node could not reach "
                                 "etcd, or was revoked"));
  COMMD_LOG(INFO, "cluster") << "the node's lease expired in etcd at " << etcd_.endpoint()
                             << "; registering " << NodeKey() << " again";
  return Register();
}

bool Cluster::SetState(bool connected, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (!connected) last_error_ = std::string(why.message());
  if (reported_ && connected == connected_) return false;
  reported_ = true;
  connected_ = connected;
  since_ = absl::Now();
  connected_gauge_->Set(connected ? 1 : 0);
  if (connected) {
    COMMD_LOG(INFO, "cluster") << "connected to etcd at " << etcd_.endpoint() << " as node "
                               << options_.node_name << " (" << NodeKey() << ", lease " << lease_
                               << ")";
  } else {
    COMMD_LOG(WARNING, "cluster") << "disconnected: " << why.message()
                                  << "; retrying with back-off up to "
                                  << absl::FormatDuration(options_.retry_max);
  }
  return connected;
}

}  // namespace commd::cluster
