// Internal to the SDK: the Recorder's ring writer on the group's control block, and the
// block's registration with CUDA for stream-ordered progress writes (made on first use).
#ifndef COMMD_CLIENT_SRC_RECORDER_IMPL_H_
#define COMMD_CLIENT_SRC_RECORDER_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "commd/recorder.h"
#include "common/control_block_writer.h"

namespace commd {

class Recorder::Impl {
 public:
  Impl() = default;
  ~Impl();  // unregisters the block from CUDA if it was registered

  // Device address of the block's progress word at `offset` (from the block's start),
  // registering the block (device-mapped) the first time. FAILED_PRECONDITION without a
  // CUDA build or driver; the registration error otherwise (also on later calls).
  absl::StatusOr<uint64_t> DeviceAddress(void* cuda_stream, uint64_t offset);

  // Enqueues on `cuda_stream` the write of `value` into the progress word at `offset`.
  absl::Status WriteOnStream(void* cuda_stream, uint64_t offset, uint64_t value);

  static RecordId Id(const RecordHandle& h) {
    return RecordId{h.record_id, h.collective_seq_id, h.bytes, static_cast<int>(h.op)};
  }
  static RecordHandle Handle(const RecordId& id) {
    return RecordHandle{id.record_id, id.collective_seq_id, id.bytes,
                        static_cast<CollectiveOp>(id.op)};
  }
  // Counts a NaN/Inf check of the entry's input; a hit also flags the entry (the SDK's own
  // collectives only: not part of the public Recorder).
  void NanChecked(const RecordId& id, bool nan_found) { writer->NanChecked(Handle(id), nan_found); }

  std::unique_ptr<RingWriter> writer;
  void* block = nullptr;  // the control block's mapping, as the writer's
  size_t block_bytes = 0;

 private:
  bool registered_ = false;
  absl::Status registration_;  // of the first attempt, kept
  uint64_t device_base_ = 0;   // CUdeviceptr of `block`
  void* context_ = nullptr;    // CUcontext the block was registered in
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_RECORDER_IMPL_H_
