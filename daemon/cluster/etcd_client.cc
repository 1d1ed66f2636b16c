#include "daemon/cluster/etcd_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_callback.h"

namespace commd::cluster {

struct EtcdClient::Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
};

namespace {

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

bool IsTransportFailure(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Why etcd cancelled a watch, in words.
std::string EtcdCancelReason(const pb::WatchResponse& r) {
  std::string why = r.cancel_reason().empty() ? "no reason given" : r.cancel_reason();
  if (r.compact_revision() > 0) {
    absl::StrAppend(&why, "; its start revision was compacted (oldest kept: ", r.compact_revision(),
                    ")");
  }
  return absl::StrCat("etcd cancelled the watch: ", why);
}

// One watch stream: self-owned until gRPC calls OnDone, so a Cancel racing the end is safe.
class WatchReactor final : public EtcdWatch,
                           public grpc::ClientBidiReactor<pb::WatchRequest, pb::WatchResponse> {
 public:
  WatchReactor(std::function<void(const pb::WatchResponse&)> on_response,
               std::function<void(grpc::Status)> on_end)
      : on_response_(std::move(on_response)), on_end_(std::move(on_end)) {}

  void Start(pb::Watch::Stub* stub, const pb::WatchCreateRequest& create,
             std::shared_ptr<WatchReactor> self) {
    self_ = std::move(self);
    // etcd's WithRequireLeader: a member that lost its leader cancels the watch (after a few
    // election timeouts) instead of keeping it open on a store that no longer moves.
    ctx_.AddMetadata("hasleader", "true");
    *request_.mutable_create_request() = create;
    stub->async()->Watch(&ctx_, this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }

  void Cancel() override { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    on_response_(response_);
    if (response_.canceled()) {
      // etcd removed the watch but keeps the stream open: nothing more would come on it.
      canceled_by_etcd_ = EtcdCancelReason(response_);
      ctx_.TryCancel();
      return;
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    if (!canceled_by_etcd_.empty()) {
      on_end_(grpc::Status(grpc::StatusCode::ABORTED, canceled_by_etcd_));
    } else {
      on_end_(status);
    }
    on_response_ = nullptr;
    on_end_ = nullptr;
    self_.reset();  // may destroy this
  }

 private:
  grpc::ClientContext ctx_;
  pb::WatchRequest request_;
  pb::WatchResponse response_;
  std::function<void(const pb::WatchResponse&)> on_response_;
  std::function<void(grpc::Status)> on_end_;
  std::shared_ptr<WatchReactor> self_;
  std::string canceled_by_etcd_;  // set by the reading thread before it cancels
};

// Blocks until the asynchronous call `start(done)` makes calls back, and returns its answer.
template <typename Response, typename Start>
absl::StatusOr<Response> Await(Start start) {
  absl::Notification finished;
  absl::StatusOr<Response> result;
  start(EtcdClient::Done<Response>([&](absl::StatusOr<Response> r) {
    result = std::move(r);
    finished.Notify();
  }));
  finished.WaitForNotification();
  return result;
}

}  // namespace

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_receive_bytes);
  // gRPC's own reconnection back-off (default: up to 120 s) would otherwise hide a returned
  // etcd for longer than the cluster module's retry_max_ms.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_initial)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_initial)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_max)));
  // Pings find a connection that went silent (EtcdOptions::keepalive). A watch with no events
  // sends no data, so pings must go on without data (gRPC stops after 2 by default).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.keepalive)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.call_timeout)));
  // Only under calls: etcd counts a ping with no stream open as a strike (and answers GOAWAY),
  // and a connection without calls has nothing to lose to silence.
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options_.tls.has_value()) {
    credentials = grpc::SslCredentials({.pem_root_certs = options_.tls->ca_pem,
                                        .pem_private_key = options_.tls->key_pem,
                                        .pem_cert_chain = options_.tls->cert_pem});
    if (!options_.tls->server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls->server_name);
    }
  }
  for (const std::string& address : options_.endpoints) {
    auto e = std::make_shared<Endpoint>();
    e->address = address;
    e->channel = grpc::CreateCustomChannel(absl::StrCat("dns:///", address), credentials, args);
    e->kv = pb::KV::NewStub(e->channel);
    e->lease = pb::Lease::NewStub(e->channel);
    e->watch = pb::Watch::NewStub(e->channel);
    endpoints_.push_back(std::move(e));
  }
}

EtcdClient::~EtcdClient() { Shutdown(); }

bool EtcdClient::Enter() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  ++in_flight_;
  return true;
}

void EtcdClient::Leave() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void EtcdClient::Shutdown() {
  std::vector<std::shared_ptr<EtcdWatch>> watches;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& w : watches_) {
      if (auto live = w.lock()) watches.push_back(std::move(live));
    }
    watches_.clear();
  }
  for (auto& w : watches) w->Cancel();
  watches.clear();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &in_flight_));
}

std::shared_ptr<EtcdClient::Endpoint> EtcdClient::Current(size_t* index) const {
  *index = current_.load() % endpoints_.size();
  return endpoints_[*index];
}

std::string EtcdClient::endpoint() const {
  size_t index;
  return Current(&index)->address;
}

absl::Status EtcdClient::Failed(size_t index, const std::string& address, absl::string_view call,
                                const grpc::Status& status) {
  if (IsTransportFailure(status.error_code())) {
    size_t expected = index;
    current_.compare_exchange_strong(expected, (index + 1) % endpoints_.size());
    return absl::UnavailableError(absl::StrCat("etcd at ", address, " is unreachable (", call, ": ",
                                               status.error_message(),
                                               "); see cluster.etcd_endpoints"));
  }
  const absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat("etcd at ", address, ": ", call, ": ", s.message()));
}

// `start(endpoint, ctx, response, callback)` issues the call on `endpoint`'s stubs.
template <typename Response, typename Start>
void EtcdClient::Unary(absl::string_view call, Start start, Done<Response> done) {
  if (!Enter()) {
    done(absl::UnavailableError("the daemon is shutting down its cluster connection"));
    return;
  }
  size_t index;
  std::shared_ptr<Endpoint> e = Current(&index);
  struct State {
    std::unique_ptr<grpc::ClientContext> ctx;
    Response response;
  };
  auto state = std::make_shared<State>();
  state->ctx = Context(options_.call_timeout);
  start(*e, state->ctx.get(), &state->response,
        [this, index, e, state, call = std::string(call),
         done = std::move(done)](grpc::Status status) {
          if (status.ok()) {
            done(std::move(state->response));
          } else {
            done(Failed(index, e->address, call, status));
          }
          Leave();
        });
}

void EtcdClient::Range(const pb::RangeRequest& request, Done<pb::RangeResponse> done) {
  auto owned = std::make_shared<pb::RangeRequest>(request);
  Unary<pb::RangeResponse>(
      "Range",
      [owned](Endpoint& e, grpc::ClientContext* ctx, pb::RangeResponse* r, auto cb) {
        e.kv->async()->Range(ctx, owned.get(), r,
                             [owned, cb = std::move(cb)](grpc::Status s) { cb(std::move(s)); });
      },
      std::move(done));
}

void EtcdClient::Txn(const pb::TxnRequest& request, Done<pb::TxnResponse> done) {
  auto owned = std::make_shared<pb::TxnRequest>(request);
  Unary<pb::TxnResponse>(
      "Txn",
      [owned](Endpoint& e, grpc::ClientContext* ctx, pb::TxnResponse* r, auto cb) {
        e.kv->async()->Txn(ctx, owned.get(), r,
                           [owned, cb = std::move(cb)](grpc::Status s) { cb(std::move(s)); });
      },
      std::move(done));
}

void EtcdClient::LeaseGrant(int64_t ttl_seconds, Done<pb::LeaseGrantResponse> done) {
  auto request = std::make_shared<pb::LeaseGrantRequest>();
  request->set_ttl(ttl_seconds);
  Unary<pb::LeaseGrantResponse>(
      "LeaseGrant",
      [request](Endpoint& e, grpc::ClientContext* ctx, pb::LeaseGrantResponse* r, auto cb) {
        e.lease->async()->LeaseGrant(ctx, request.get(), r,
                                     [request, cb = std::move(cb)](grpc::Status s) { cb(s); });
      },
      std::move(done));
}

void EtcdClient::LeaseRevoke(int64_t id, Done<pb::LeaseRevokeResponse> done) {
  auto request = std::make_shared<pb::LeaseRevokeRequest>();
  request->set_id(id);
  Unary<pb::LeaseRevokeResponse>(
      "LeaseRevoke",
      [request](Endpoint& e, grpc::ClientContext* ctx, pb::LeaseRevokeResponse* r, auto cb) {
        e.lease->async()->LeaseRevoke(ctx, request.get(), r,
                                      [request, cb = std::move(cb)](grpc::Status s) { cb(s); });
      },
      std::move(done));
}

absl::StatusOr<pb::TxnResponse> EtcdClient::TxnSync(const pb::TxnRequest& request) {
  return Await<pb::TxnResponse>([&](auto done) { Txn(request, std::move(done)); });
}

absl::StatusOr<pb::LeaseGrantResponse> EtcdClient::LeaseGrantSync(int64_t ttl_seconds) {
  return Await<pb::LeaseGrantResponse>(
      [&](auto done) { LeaseGrant(ttl_seconds, std::move(done)); });
}

absl::Status EtcdClient::LeaseRevokeSync(int64_t id) {
  return Await<pb::LeaseRevokeResponse>([&](auto done) { LeaseRevoke(id, std::move(done)); })
      .status();
}

absl::StatusOr<std::vector<int64_t>> EtcdClient::KeepAliveSync(const std::vector<int64_t>& ids,
                                                               absl::Duration timeout) {
  size_t index;
  std::shared_ptr<Endpoint> e = Current(&index);
  auto ctx = Context(timeout);
  auto stream = e->lease->LeaseKeepAlive(ctx.get());
  std::vector<int64_t> ttls;
  for (int64_t id : ids) {
    pb::LeaseKeepAliveRequest request;
    request.set_id(id);
    pb::LeaseKeepAliveResponse response;
    // etcd answers each request before reading the next one.
    if (!stream->Write(request) || !stream->Read(&response)) break;
    ttls.push_back(response.ttl());
  }
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (ttls.size() == ids.size()) return ttls;
  if (status.ok()) status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended early");
  return Failed(index, e->address, "LeaseKeepAlive", status);
}

std::shared_ptr<EtcdWatch> EtcdClient::Watch(
    const pb::WatchCreateRequest& create, std::function<void(const pb::WatchResponse&)> on_response,
    std::function<void(absl::Status)> on_end) {
  if (!Enter()) {
    on_end(absl::UnavailableError("the daemon is shutting down its cluster connection"));
    return nullptr;
  }
  size_t index;
  std::shared_ptr<Endpoint> e = Current(&index);
  auto reactor = std::make_shared<WatchReactor>(
      std::move(on_response), [this, index, e, on_end = std::move(on_end)](grpc::Status status) {
        if (status.error_code() == grpc::StatusCode::CANCELLED) {
          on_end(absl::OkStatus());  // our own Cancel
        } else {
          if (status.ok()) status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch ended");
          on_end(Failed(index, e->address, "Watch", status));
        }
        Leave();
      });
  {
    absl::MutexLock lock(&mu_);
    // Forget the watches that ended, so the list stays as long as the live ones.
    std::erase_if(watches_, [](const std::weak_ptr<EtcdWatch>& w) { return w.expired(); });
    watches_.push_back(reactor);
  }
  reactor->Start(e->watch.get(), create, reactor);
  return reactor;
}

}  // namespace commd::cluster
