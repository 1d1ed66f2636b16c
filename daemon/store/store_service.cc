#include "daemon/store/store_service.h"

#include "common/status_macros.h"

namespace commd::store {
namespace {

Namespace Of(const server::Session& s) { return {s.uid, s.job_id}; }

}  // namespace

StoreService::StoreService(server::RpcContext* rpc, KvStore* store, prometheus::Registry* registry)
    : rpc_(rpc), store_(store) {
  keys_ = &prometheus::BuildGauge()
               .Name("commd_store_keys")
               .Help("Keys held in the per-job stores")
               .Register(*registry)
               .Add({});
  waiters_ = &prometheus::BuildGauge()
                  .Name("commd_store_waiters")
                  .Help("Store Wait calls waiting for keys")
                  .Register(*registry)
                  .Add({});
  bytes_ = &prometheus::BuildGauge()
                .Name("commd_store_bytes")
                .Help(
                    "Bytes the per-job stores hold (keys, values, pending waits' keys), as "
                    "counted against limits.max_store_bytes")
                .Register(*registry)
                .Add({});
}

void StoreService::UpdateGauges() {
  absl::MutexLock lock(&gauges_mu_);
  keys_->Set(static_cast<double>(store_->key_count()));
  waiters_->Set(static_cast<double>(store_->waiter_count()));
  bytes_->Set(static_cast<double>(store_->byte_count()));
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* ctx,
                                            const v1::SetRequest* request,
                                            v1::SetResponse* response) {
  return rpc_->Serve(ctx, "StoreSet", [&](const server::Session& s) {
    RETURN_IF_ERROR(store_->Set(Of(s), request->key(), request->value()));
    UpdateGauges();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  return rpc_->Serve(ctx, "StoreGet", [&](const server::Session& s) -> absl::Status {
    ASSIGN_OR_RETURN(*response->mutable_value(), store_->Get(Of(s), request->key()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* ctx,
                                             const v1::WaitRequest* request,
                                             v1::WaitResponse* response) {
  return rpc_->ServeLater(ctx, "StoreWait", [&](auto session, auto call) {
    const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    auto id = store_->Wait(Of(*session), keys, absl::Milliseconds(request->timeout_ms()),
                           [this, call](absl::Status status) {
                             call->Finish(status);
                             UpdateGauges();
                           });
    if (!id.ok()) return call->Finish(id.status());
    UpdateGauges();
    call->OnCancel([this, id = *id] {
      store_->CancelWait(id);
      UpdateGauges();
    });
  });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* ctx,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  return rpc_->Serve(ctx, "StoreAdd", [&](const server::Session& s) -> absl::Status {
    ASSIGN_OR_RETURN(int64_t value, store_->Add(Of(s), request->key(), request->delta()));
    response->set_value(value);
    UpdateGauges();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* ctx,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  return rpc_->Serve(ctx, "StoreCompareSet", [&](const server::Session& s) -> absl::Status {
    ASSIGN_OR_RETURN(
        *response->mutable_value(),
        store_->CompareSet(Of(s), request->key(), request->expected(), request->desired()));
    UpdateGauges();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx,
                                               const v1::DeleteRequest* request,
                                               v1::DeleteResponse* response) {
  return rpc_->Serve(ctx, "StoreDelete", [&](const server::Session& s) -> absl::Status {
    ASSIGN_OR_RETURN(bool existed, store_->Delete(Of(s), request->key()));
    response->set_existed(existed);
    UpdateGauges();
    return absl::OkStatus();
  });
}

}  // namespace commd::store
