// Records collectives that run outside commd's kernels (NCCL, torch.distributed) into the
// rank's flight recorder, which lives in memory the daemon reads: it can be dumped while
// this process is stuck, and after it died.
//
//   commd::Recorder& rec = group->recorder();
//   const int64_t dims[] = {1024, 1024};
//   const commd::TensorDesc t{dims, 2, commd::DataType::kBFloat16};
//   commd::RecordId id = rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
//   rec.Started(id);   // when it starts on the stream (or at once)
//   ...
//   rec.Completed(id); // or Abandoned(id) when it failed
//
// Each call is a few stores into shared memory: no lock, no allocation, no system call.
// Not thread-safe: one thread at a time per group, as with the group's collectives.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_RECORDER_H_
#define COMMD_CLIENT_INCLUDE_COMMD_RECORDER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "commd/export.h"
#include "commd/types.h"

namespace commd {

enum class CollectiveOp {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kBarrier,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
};

// A tensor argument: `dims` (borrowed for the call) holds `ndim` sizes.
struct TensorDesc {
  const int64_t* dims = nullptr;
  int ndim = 0;
  DataType dtype = DataType::kFloat32;
};

struct RecordId {
  uint64_t record_id = ~uint64_t{0};
  uint64_t collective_seq_id = 0;
  uint64_t bytes = 0;
  int op = 0;
};

class COMMD_API Recorder {
 public:
  class Impl;  // opaque: internal to the SDK
  explicit Recorder(std::unique_ptr<Impl> impl);
  ~Recorder();

  // `peer` is the other rank of a send/recv; `timeout_ms` is shown in dumps.
  RecordId Begin(CollectiveOp op, std::span<const TensorDesc> inputs,
                 std::span<const TensorDesc> outputs, int peer = -1, uint64_t timeout_ms = 0);
  void Started(const RecordId& id);
  void Completed(const RecordId& id);
  void Abandoned(const RecordId& id);
  // Marks this rank alive while it holds no collective (the watchdog reads it).
  void Heartbeat();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_RECORDER_H_
