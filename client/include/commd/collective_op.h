// Which collective: the one name of a collective in the SDK (Group's calls, the Recorder), the
// kernels, the flight recorder's ring (its op codes), the daemon's recorder, watchdog and dump
// format, and commd-bench. Self-contained (no includes) so that kernels/, common/ and device
// code can include it too.
//
//   rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
//
// The values up to kReduceScatterCoalesced are the ring's op codes (RingEntry::op in
// common/control_block.h, an ABI: kRecordOpCount of them), so each is written out: never
// renumber, only append. Those after them are SDK calls only and never stand in a ring.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_
#define COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_

namespace commd {

enum class CollectiveOp {
  kAllReduce = 0,
  kAllGather = 1,
  kReduceScatter = 2,
  kBroadcast = 3,
  kReduce = 4,
  kBarrier = 5,
  kAllToAll = 6,
  kGather = 7,
  kScatter = 8,
  kSend = 9,
  kRecv = 10,
  // Closes a coalesced group whose members share a sequence id (recorder only).
  kCoalesced = 11,
  // Many tensors as one collective (Group::AllReduceCoalesced; the SDK records it as
  // kAllReduce).
  kAllReduceCoalesced = 12,
  kAllGatherCoalesced = 13,
  kReduceScatterCoalesced = 14,
  // The fused matmuls (Group::AllGatherMatmul, MatmulReduceScatter): SDK calls only, recorded
  // as kAllGather and kReduceScatter, never ring op codes.
  kAllGatherMatmul = 15,
  kMatmulReduceScatter = 16,
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_
