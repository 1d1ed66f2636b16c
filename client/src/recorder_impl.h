// Internal to the SDK: the Recorder's ring writer on the group's control block.
#ifndef COMMD_CLIENT_SRC_RECORDER_IMPL_H_
#define COMMD_CLIENT_SRC_RECORDER_IMPL_H_

#include <memory>

#include "commd/recorder.h"
#include "common/control_block_writer.h"

namespace commd {

class Recorder::Impl {
 public:
  static RecordHandle Handle(const RecordId& id) {
    return RecordHandle{id.record_id, id.collective_seq_id, id.bytes, static_cast<RecordOp>(id.op)};
  }
  // Counts a NaN/Inf check of the entry's input; a hit also flags the entry (the SDK's own
  // collectives only: not part of the public Recorder).
  void NanChecked(const RecordId& id, bool nan_found) { writer->NanChecked(Handle(id), nan_found); }

  std::unique_ptr<RingWriter> writer;
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_RECORDER_IMPL_H_
