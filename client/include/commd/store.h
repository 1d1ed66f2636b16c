// The per-job key-value store: what the ranks of a job exchange (an ncclUniqueId, addresses,
// counters), kept by the node's daemon.
//
//   commd::Store& store = client->store();
//   if (rank == 0) RETURN_IF_ERROR(store.Set("nccl_id", id_bytes));
//   RETURN_IF_ERROR(store.Wait({"nccl_id"}, absl::Seconds(60)));
//   ASSIGN_OR_RETURN(std::string id, store.Get("nccl_id"));
//
// Keys belong to the client's (uid, job id): another job's or another user's keys are
// invisible (NOT_FOUND), never refused. Keys are UTF-8 text (a protobuf string), values any
// bytes. The daemon's config limits their sizes, their number and their total bytes per job
// (RESOURCE_EXHAUSTED naming the limits.max_store_* field that was hit).
//
// Every call blocks for one round trip to the daemon (Wait until its keys exist or its
// timeout passes); none throws. Thread-safe: any thread may call at any time. Owned by its
// Client and valid as long as it.
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

  // Stores `value` under `key`, replacing any value; completes the Waits it was missing for.
  absl::Status Set(const std::string& key, const std::string& value);
  // The value under `key`; NOT_FOUND when the key is absent.
  absl::StatusOr<std::string> Get(const std::string& key);
  // Blocks until every key exists (OK at once if they do), or fails with DEADLINE_EXCEEDED
  // naming the keys still missing after `timeout`; at most the daemon's groups.max_timeout_ms
  // (INVALID_ARGUMENT above it). The daemon holds no thread for a waiting call.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  // Atomically adds `delta` to the integer under `key` (absent counts as 0) and returns the
  // sum. The value is kept as decimal text, as PyTorch's TCPStore does, so Get returns
  // e.g. "42" and Set("n", "41") makes a counter. FAILED_PRECONDITION when the value is not
  // a decimal integer, OUT_OF_RANGE when the sum overflows int64.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Atomically sets `desired` if the value is `expected` (an absent key matches an empty
  // `expected`, as in TCPStore's compareSet); returns the value stored afterwards either way
  // (empty when the key is absent and was not set).
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired);
  // Removes `key`; returns whether it existed.
  absl::StatusOr<bool> Delete(const std::string& key);

 private:
  Impl* impl_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_STORE_H_
