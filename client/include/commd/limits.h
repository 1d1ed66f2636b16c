// The limits on what a rank asks of the daemon, stated once: the SDK checks them before it
// asks, the daemon checks them again (it trusts no client), the Python binding exposes them
// (commd._commd.MAX_GROUP_DESCRIPTION_BYTES, ...) and error messages name them. Self-contained
// (no includes of commd's own), so that the daemon can include it too; where a limit is also
// a range of the daemon's config (config.proto), daemon/config/config_test.cc holds the two
// together.
//
//   if (options.description.size() > commd::kMaxGroupDescriptionBytes) ...
#ifndef COMMD_CLIENT_INCLUDE_COMMD_LIMITS_H_
#define COMMD_CLIENT_INCLUDE_COMMD_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace commd {

// The range of a NaN/Inf check's sample period (GroupOptions::nan_sample_period and
// CollectiveOptions::nan_sample_period under kSampled); the daemon's config
// collectives.nan_sample_period has the same range.
inline constexpr uint32_t kMinNanSamplePeriod = 1;
inline constexpr uint32_t kMaxNanSamplePeriod = 1000000;

// The longest GroupOptions::description the daemon takes: it fits a flight-recorder entry's
// process-group description (common/control_block.h kRecordNameBytes, NUL included), so that a
// dump's process group and its entries say the same; torch's descriptions ("default_pg",
// "undefined", a new_group's group_desc) are short.
inline constexpr size_t kMaxGroupDescriptionBytes = 63;

// The largest GroupOptions::global_world_size the daemon takes. Every rank's JoinGroup answer
// carries the whole layout (a global rank per rank of the group), and a node reads every
// node's part in one etcd answer (8 MiB at most): 16384 ranks keep both well inside (a
// 2048-node job of 8 GPUs each).
inline constexpr int kMaxGlobalWorldSize = 16384;

// Point-to-point (Group::Send and friends): the largest tag, and how many channels (one per
// direction, peer and tag, each a two-rank group on the daemon) one rank may open in one
// group. 256 covers a rank talking both ways with 127 peers on one tag; a program that makes
// a tag per message would otherwise fill the node's group table (limits.max_groups).
inline constexpr int kMaxPointToPointTag = 0x7fffffff;
inline constexpr int kMaxPointToPointChannels = 256;

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_LIMITS_H_
