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
// One collective run as several of commd's own calls (a tensor staged through a buffer in
// chunks) is one entry: begin it here with the whole collective's tensors and pass its id as
// each call's CollectiveOptions::part_of (commd/group.h); complete or abandon it after. On
// CUDA buffers, mark it started and completed stream-ordered (below) on the parts' stream.
//
// Each call is a few stores into shared memory: no lock, no allocation, no system call.
// Not thread-safe: one thread at a time per group, as with the group's collectives.
//
// Stream-ordered recording (collectives that run on a CUDA stream):
//
//   commd::RecordId id = rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
//   RETURN_IF_ERROR(rec.Started(id, stream));    // before the kernel on `stream`
//   ncclAllReduce(..., stream);
//   RETURN_IF_ERROR(rec.Completed(id, stream));  // after it
//
// These enqueue on the stream a 64-bit write (cuStreamWriteValue64) of the collective's
// sequence id into the control block's progress words (last_started_seq /
// last_completed_seq), so those words say where the GPU is, not where the CPU got to: the
// watchdog and the dumps' pg_status read them. The ring entry itself (state, times,
// counters) is written by the CPU at enqueue time, so in a dump an entry may read
// "completed" while pg_status shows the GPU has not reached it. The daemon's discovery
// stamps (time_discovered_*) follow the entry's state, so they too are enqueue-time for
// these entries. Use one kind of call per group: a progress word written both by the CPU
// (Started(id)) and by a stream may go backwards.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_RECORDER_H_
#define COMMD_CLIENT_INCLUDE_COMMD_RECORDER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "commd/collective_op.h"
#include "commd/export.h"
#include "commd/types.h"

namespace commd {

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

  // Stream-ordered Started / Completed (see the top of this file). `cuda_stream` is a
  // cudaStream_t / CUstream, as CollectiveOptions::cuda_stream. The first call registers the
  // control block's first page with CUDA (cuMemHostRegister, device-mapped, in the stream's
  // context); later calls only enqueue. Does not wait for the stream.
  // - A null stream without a usable CUDA driver (host-only SDK build, or no driver or
  //   device) is the CPU path: the same as Started(id) / Completed(id), and OK.
  // - A non-null stream without one: FAILED_PRECONDITION, nothing recorded.
  // - With a driver, a null stream is the legacy default stream of the current context.
  // - A CUDA error (registration, enqueue): INTERNAL with the driver's error, nothing
  //   recorded for this call.
  absl::Status Started(const RecordId& id, void* cuda_stream);
  absl::Status Completed(const RecordId& id, void* cuda_stream);
  // Marks this rank alive while it holds no collective (the watchdog reads it).
  void Heartbeat();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_RECORDER_H_
