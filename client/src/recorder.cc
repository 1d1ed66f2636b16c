#include "commd/recorder.h"

#include <algorithm>
#include <array>

#include "client/src/recorder_impl.h"

namespace commd {
namespace {

static_assert(static_cast<int>(CollectiveOp::kAllReduce) == static_cast<int>(RecordOp::kAllReduce));
static_assert(static_cast<int>(CollectiveOp::kBarrier) == static_cast<int>(RecordOp::kBarrier));
static_assert(static_cast<int>(CollectiveOp::kRecv) == static_cast<int>(RecordOp::kRecv));

RecordDtype ToRecordDtype(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return RecordDtype::kFloat32;
    case DataType::kFloat16:
      return RecordDtype::kFloat16;
    case DataType::kBFloat16:
      return RecordDtype::kBFloat16;
    case DataType::kInt32:
      return RecordDtype::kInt32;
    case DataType::kInt64:
      return RecordDtype::kInt64;
  }
  return RecordDtype::kFloat32;
}

// Converts without allocating: at most kRecordMaxTensors are recorded per side anyway.
size_t Convert(std::span<const TensorDesc> in, std::array<RecordTensor, kRecordMaxTensors>* out) {
  const size_t n = std::min<size_t>(in.size(), kRecordMaxTensors);
  for (size_t i = 0; i < n; ++i) {
    (*out)[i] = RecordTensor{.dims = in[i].dims,
                             .ndim = static_cast<uint32_t>(in[i].ndim),
                             .dtype = ToRecordDtype(in[i].dtype)};
  }
  return n;
}

RecordHandle ToHandle(const RecordId& id) { return Recorder::Impl::Handle(id); }

}  // namespace

Recorder::Recorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recorder::~Recorder() = default;

RecordId Recorder::Begin(CollectiveOp op, std::span<const TensorDesc> inputs,
                         std::span<const TensorDesc> outputs, int peer, uint64_t timeout_ms) {
  std::array<RecordTensor, kRecordMaxTensors> in{}, out{};
  const size_t n_in = Convert(inputs, &in);
  const size_t n_out = Convert(outputs, &out);
  // CollectiveOp's values are the first RecordOps, in the same order.
  const RecordHandle h = impl_->writer->Begin({.op = static_cast<RecordOp>(op),
                                               .inputs = {in.data(), n_in},
                                               .outputs = {out.data(), n_out},
                                               .peer = peer,
                                               .timeout_ms = timeout_ms});
  return RecordId{h.record_id, h.collective_seq_id, h.bytes, static_cast<int>(h.op)};
}

void Recorder::Started(const RecordId& id) { impl_->writer->Started(ToHandle(id)); }
void Recorder::Completed(const RecordId& id) { impl_->writer->Completed(ToHandle(id)); }
void Recorder::Abandoned(const RecordId& id) { impl_->writer->Abandon(ToHandle(id)); }
void Recorder::Heartbeat() { impl_->writer->Heartbeat(); }

}  // namespace commd
