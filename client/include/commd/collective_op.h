// Which collective: the one name of a collective in the SDK (Group's calls, the Recorder), the
// kernels, the flight recorder's ring and commd-bench. Self-contained (no includes) so that
// kernels/ and device code can include it too.
//
//   rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
//
// The values are the flight recorder's op codes (RecordOp in common/control_block.h, the
// ring's ABI; client/src/recorder.cc asserts they agree): never renumber, only append.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_
#define COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_

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
  // Closes a coalesced group whose members share a sequence id (recorder only).
  kCoalesced,
  // Many tensors as one collective (Group::AllReduceCoalesced; recorded as kAllReduce).
  kAllReduceCoalesced,
  kAllGatherCoalesced,
  kReduceScatterCoalesced,
  // The fused matmuls (Group::AllGatherMatmul, MatmulReduceScatter): SDK calls only, recorded
  // as kAllGather and kReduceScatter, never ring op codes.
  kAllGatherMatmul,
  kMatmulReduceScatter,
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_
