// A client of etcd's v3 gRPC API (proto/etcd/): the calls commd's cluster module makes, over
// one gRPC channel per configured endpoint.
//
//   EtcdClient etcd({.endpoints = {"127.0.0.1:2379"}, .call_timeout = absl::Seconds(5)});
//   etcd.Range(request, [](absl::StatusOr<etcdserverpb::RangeResponse> r) { ... });
//   ASSIGN_OR_RETURN(auto granted, etcd.LeaseGrantSync(10));
//
// Asynchronous calls hold no thread while they wait: their callback runs on a gRPC thread,
// once. The *Sync calls block the caller (the cluster's own thread, never a handler). Every
// call has the configured deadline; a failure to reach etcd is UNAVAILABLE naming the endpoint
// ("etcd at 127.0.0.1:2379 is unreachable: ... (cluster.etcd_endpoints)"), and the next call
// goes to the next endpoint. Thread-safe.
#ifndef COMMD_DAEMON_CLUSTER_ETCD_CLIENT_H_
#define COMMD_DAEMON_CLUSTER_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"

namespace commd::cluster {

namespace pb = ::etcdserverpb;

// TLS to etcd: PEM text (not file names); empty fields as EtcdTlsConfig says.
struct EtcdTls {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string server_name;
};

struct EtcdOptions {
  std::vector<std::string> endpoints;  // HOST:PORT
  std::optional<EtcdTls> tls;          // unset: plain gRPC
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration reconnect_initial = absl::Milliseconds(200);  // the channels' own back-off
  absl::Duration reconnect_max = absl::Seconds(10);
  // HTTP/2 pings on every connection to etcd with calls (watches) in flight: a connection
  // whose ping is not answered within call_timeout is closed, so a half-open TCP connection
  // (a peer that vanished without a FIN, a member frozen) ends its watches and the next calls
  // go to the next endpoint instead of leaving the watches silent. At least etcd's
  // --grpc-keepalive-min-time (5 s by default), or etcd answers GOAWAY.
  absl::Duration keepalive = absl::Seconds(10);
  int max_receive_bytes = 8 << 20;  // bounds what one etcd answer may cost the daemon
};

// The range_end that makes a Range, DeleteRange, Watch or Compare cover every key starting
// with `prefix` (etcd's convention: the prefix with its last byte incremented).
std::string PrefixEnd(absl::string_view prefix);

// A watch on one key range, on its own gRPC stream. Cancel ends it; `on_end` runs once
// either way (after the last `on_response`). A response with `canceled` (etcd ended the watch:
// its start revision was compacted, or its member lost the leader) is the last one: the stream
// is closed after it and `on_end` gets ABORTED with etcd's reason. Watches carry etcd's
// `hasleader` requirement, so a member cut off from the raft leader cancels them instead of
// serving a stale, silent watch.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  virtual void Cancel() = 0;
};

class EtcdClient {
 public:
  template <typename Response>
  using Done = std::function<void(absl::StatusOr<Response>)>;

  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();  // calls Shutdown

  // Cancels the watches, waits for every call in flight to call back (their deadlines bound
  // the wait), and fails later calls at once with UNAVAILABLE. Idempotent.
  void Shutdown();

  // The endpoint the next call goes to.
  std::string endpoint() const;

  void Range(const pb::RangeRequest& request, Done<pb::RangeResponse> done);
  void Txn(const pb::TxnRequest& request, Done<pb::TxnResponse> done);
  void LeaseGrant(int64_t ttl_seconds, Done<pb::LeaseGrantResponse> done);
  void LeaseRevoke(int64_t id, Done<pb::LeaseRevokeResponse> done);

  absl::StatusOr<pb::TxnResponse> TxnSync(const pb::TxnRequest& request);
  absl::StatusOr<pb::LeaseGrantResponse> LeaseGrantSync(int64_t ttl_seconds);
  absl::Status LeaseRevokeSync(int64_t id);
  // Refreshes every lease in `ids` over one stream within `timeout`; returns each one's TTL in
  // seconds, 0 for a lease etcd no longer has (expired or revoked).
  absl::StatusOr<std::vector<int64_t>> KeepAliveSync(const std::vector<int64_t>& ids,
                                                     absl::Duration timeout);

  // Watches [create.key, create.range_end) from create.start_revision. `on_response` runs
  // for every answer (on gRPC threads, one at a time); `on_end` once, with OK after Cancel
  // and ABORTED naming etcd's reason after a `canceled` response.
  // After Shutdown it returns nullptr, having run `on_end` with UNAVAILABLE.
  std::shared_ptr<EtcdWatch> Watch(const pb::WatchCreateRequest& create,
                                   std::function<void(const pb::WatchResponse&)> on_response,
                                   std::function<void(absl::Status)> on_end);

  struct Endpoint;

 private:
  // The endpoint to use now, and its index (for Failed).
  std::shared_ptr<Endpoint> Current(size_t* index) const;
  // A call to endpoint `index` failed with `status`: the status as callers see it, and on a
  // transport failure the next calls go to the next endpoint.
  absl::Status Failed(size_t index, const std::string& address, absl::string_view call,
                      const grpc::Status& status);
  template <typename Response, typename Start>
  void Unary(absl::string_view call, Start start, Done<Response> done);

  // Counts a call in flight; false once shutting down (the call must not start).
  bool Enter();
  void Leave();

  const EtcdOptions options_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<EtcdWatch>> watches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
};

}  // namespace commd::cluster

#endif  // COMMD_DAEMON_CLUSTER_ETCD_CLIENT_H_
