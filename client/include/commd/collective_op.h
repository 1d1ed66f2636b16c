// Which collective: the one name of a collective in the SDK (Group's calls, the Recorder), the
// kernels, the flight recorder's ring (its op codes), the daemon's recorder, watchdog and dump
// format, and commd-bench. The enum and its names are rows of commd/vocabulary.h, which this
// header re-exports.
//
//   rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
//   commd::CollectiveName(commd::CollectiveOp::kAllToAll)  // "all_to_all"
//
// The values up to kReduceScatterCoalesced are the ring's op codes (an ABI): never renumber,
// only append. Those after them are SDK calls only and never stand in a ring.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_
#define COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_

#include "commd/vocabulary.h"  // IWYU pragma: export

#endif  // COMMD_CLIENT_INCLUDE_COMMD_COLLECTIVE_OP_H_
