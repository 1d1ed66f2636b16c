// HostCommView: what the CPU collectives need to know about one symmetric allocation, as
// the SDK (or a test) has mapped it into this process.
//
//   HostCommView view{.rank = 1, .world_size = 4, .data = data_ptrs, .pads = pad_ptrs,
//                     .data_bytes = bytes, .pad_slots = SignalPadBytes(4) / 4,
//                     .abort_word = &control_block->abort.reason,
//                     .deadline = absl::Now() + absl::Minutes(10)};
//
// The view borrows every pointer; the mappings must outlive the calls that use it.
#ifndef COMMD_KERNELS_HOST_COMM_VIEW_H_
#define COMMD_KERNELS_HOST_COMM_VIEW_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace commd::kernels {

struct HostCommView {
  int rank = -1;
  int world_size = 0;
  // [world_size] each rank's data region (after its signal pad), mapped in this process.
  std::byte* const* data = nullptr;
  // [world_size] each rank's signal pad, mapped in this process.
  uint32_t* const* pads = nullptr;
  size_t data_bytes = 0;  // bytes of every rank's data region
  size_t pad_slots = 0;   // uint32 slots of every rank's pad; >= SignalPadBytes(world_size) / 4
  // Nonzero asks every wait to give up with ABORTED (the control block's abort word, read
  // with acquire loads). May be null: no abort.
  const uint32_t* abort_word = nullptr;
  // Every wait gives up with DEADLINE_EXCEEDED after this time,
  absl::Time deadline = absl::InfiniteFuture();
  // or once it has waited this long. The SDK sets this rather than a deadline: a wait that
  // ends within its first spins then reads no clock, where a deadline costs one per call.
  absl::Duration wait_limit = absl::InfiniteDuration();
  // A wait that sleeps stores the time (CLOCK_REALTIME ns, relaxed atomic store) here at
  // least every kHeartbeatPeriod, so that the daemon's watchdog tells a rank waiting for a
  // late peer from one that stopped (the control block's heartbeat word). May be null.
  uint64_t* heartbeat_ns = nullptr;
  // Called once, when set, right after this rank's message of the call went out (its input
  // staged, its call words sent) and before its first wait: the caller's own work runs there
  // while the peers' messages are on their way, off the path between ranks (the SDK records
  // the call's flight-recorder entry there). Only the collectives that stage call it
  // (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all), and not when they fail
  // or return before sending.
  void (*posted)(void* context) = nullptr;
  void* posted_context = nullptr;
};

inline constexpr absl::Duration kHeartbeatPeriod = absl::Milliseconds(100);

// INVALID_ARGUMENT naming the offending value and the allowed range when the view cannot be
// used: world size or rank out of range, null arrays or pointers, too few pad slots.
absl::Status ValidateHostCommView(const HostCommView& view);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_COMM_VIEW_H_
