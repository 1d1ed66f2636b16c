#include "commd/store.h"

#include "client/src/client_impl.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace commd {

absl::Status Store::Set(const std::string& key, const std::string& value) {
  v1::SetRequest request;
  request.set_key(key);
  request.set_value(value);
  v1::SetResponse response;
  return FromGrpcStatus(impl_->stub->Set(impl_->client->Context().get(), request, &response));
}

absl::StatusOr<std::string> Store::Get(const std::string& key) {
  v1::GetRequest request;
  request.set_key(key);
  v1::GetResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->stub->Get(impl_->client->Context().get(), request, &response)));
  return std::move(*response.mutable_value());
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  v1::WaitRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::WaitResponse response;
  return FromGrpcStatus(
      impl_->stub->Wait(impl_->client->WaitingContext(timeout).get(), request, &response));
}

absl::StatusOr<int64_t> Store::Add(const std::string& key, int64_t delta) {
  v1::AddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  v1::AddResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->stub->Add(impl_->client->Context().get(), request, &response)));
  return response.value();
}

absl::StatusOr<std::string> Store::CompareSet(const std::string& key, const std::string& expected,
                                              const std::string& desired) {
  v1::CompareSetRequest request;
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  v1::CompareSetResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->stub->CompareSet(impl_->client->Context().get(), request, &response)));
  return std::move(*response.mutable_value());
}

absl::StatusOr<bool> Store::Delete(const std::string& key) {
  v1::DeleteRequest request;
  request.set_key(key);
  v1::DeleteResponse response;
  RETURN_IF_ERROR(
      FromGrpcStatus(impl_->stub->Delete(impl_->client->Context().get(), request, &response)));
  return response.existed();
}

}  // namespace commd
