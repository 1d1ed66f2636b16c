#include "daemon/store/store_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace commd::store {
namespace {

// `fill(value)` puts a successful answer into the response before the call finishes.
template <typename T, typename Fill>
StoreBackend::Done<T> Answer(std::shared_ptr<server::PendingCall> call, Fill fill) {
  return [call = std::move(call), fill = std::move(fill)](absl::StatusOr<T> r) {
    if (!r.ok()) return call->Finish(r.status());
    call->FinishOk([&] { fill(*std::move(r)); });
  };
}

}  // namespace

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* ctx,
                                            const v1::SetRequest* request,
                                            v1::SetResponse* response) {
  return rpc_->ServeLater(ctx, "StoreSet", [&](auto session, auto call) {
    store_->Set(*session, request->key(), request->value(), Answer<bool>(call, [](bool) {}));
  });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  return rpc_->ServeLater(ctx, "StoreGet", [&](auto session, auto call) {
    store_->Get(*session, request->key(), Answer<std::string>(call, [response](std::string v) {
      *response->mutable_value() = std::move(v);
    }));
  });
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* ctx,
                                             const v1::WaitRequest* request,
                                             v1::WaitResponse* response) {
  return rpc_->ServeLater(ctx, "StoreWait", [&](auto session, auto call) {
    const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    auto id = store_->Wait(*session, keys, absl::Milliseconds(request->timeout_ms()),
                           [call](absl::Status status) { call->Finish(status); });
    if (!id.ok()) return call->Finish(id.status());
    call->OnCancel([this, id = *id] { store_->CancelWait(id); });
  });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* ctx,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  return rpc_->ServeLater(ctx, "StoreAdd", [&](auto session, auto call) {
    store_->Add(*session, request->key(), request->delta(),
                Answer<int64_t>(call, [response](int64_t v) { response->set_value(v); }));
  });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* ctx,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  return rpc_->ServeLater(ctx, "StoreCompareSet", [&](auto session, auto call) {
    store_->CompareSet(*session, request->key(), request->expected(), request->desired(),
                       Answer<std::string>(call, [response](std::string v) {
                         *response->mutable_value() = std::move(v);
                       }));
  });
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx,
                                               const v1::DeleteRequest* request,
                                               v1::DeleteResponse* response) {
  return rpc_->ServeLater(ctx, "StoreDelete", [&](auto session, auto call) {
    store_->Delete(*session, request->key(), Answer<bool>(call, [response](bool existed) {
      response->set_existed(existed);
    }));
  });
}

}  // namespace commd::store
