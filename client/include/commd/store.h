// The per-job key-value store: what the ranks of a job exchange (an ncclUniqueId, addresses,
// counters), kept by the node's daemon.
//
//   commd::Store& store = client->store();
//   if (rank == 0) RETURN_IF_ERROR(store.Set("nccl_id", id_bytes));
//   RETURN_IF_ERROR(store.Wait({"nccl_id"}, absl::Seconds(60)));
//   ASSIGN_OR_RETURN(std::string id, store.Get("nccl_id"));
//
// Keys belong to the client's (uid, job id). Every call blocks for one round trip to the
// daemon (Wait until the keys exist or its timeout). Thread-safe; owned by its Client.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_STORE_H_
#define COMMD_CLIENT_INCLUDE_COMMD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/export.h"

namespace commd {

class COMMD_API Store {
 public:
  class Impl;  // opaque: internal to the SDK
  explicit Store(Impl* impl) : impl_(impl) {}

  absl::Status Set(const std::string& key, const std::string& value);
  // NOT_FOUND when the key is absent.
  absl::StatusOr<std::string> Get(const std::string& key);
  // Blocks until every key exists; DEADLINE_EXCEEDED naming the missing ones after `timeout`.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  // Adds `delta` to the integer under `key` (absent counts as 0) and returns the sum.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Sets `desired` if the value is `expected` (an absent key matches ""); returns the value
  // stored afterwards either way.
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired);
  // Whether the key existed.
  absl::StatusOr<bool> Delete(const std::string& key);

 private:
  Impl* impl_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_STORE_H_
