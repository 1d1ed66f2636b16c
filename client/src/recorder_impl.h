// Internal to the SDK: the Recorder's ring writer on the group's control block.
#ifndef COMMD_CLIENT_SRC_RECORDER_IMPL_H_
#define COMMD_CLIENT_SRC_RECORDER_IMPL_H_

#include <memory>

#include "commd/recorder.h"
#include "common/control_block_writer.h"

namespace commd {

class Recorder::Impl {
 public:
  std::unique_ptr<RingWriter> writer;
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_RECORDER_IMPL_H_
