// The checks every view of a symmetric allocation passes before a collective touches memory,
// written once for the CPU path's HostCommView (host/comm_view.h) and the CUDA path's
// CudaCommView (cuda/collectives.h): what the two share is read into a CommViewShape, and
// what differs between the paths (the largest world, the signal pad each needs) comes in
// CommViewRules.
//
//   RETURN_IF_ERROR(CheckCommView(ShapeOfView(v), kRules));
#ifndef COMMD_KERNELS_COMM_VIEW_CHECK_H_
#define COMMD_KERNELS_COMM_VIEW_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace commd::kernels {

// Borrowed from the view being checked.
struct CommViewShape {
  int rank = -1;
  int world_size = 0;
  std::byte* const* data = nullptr;  // [world_size]
  uint32_t* const* pads = nullptr;   // [world_size]
  size_t pad_slots = 0;
};

// The shape of either path's view (its fields have the same names).
template <typename View>
CommViewShape ShapeOfView(const View& v) {
  return {.rank = v.rank,
          .world_size = v.world_size,
          .data = v.data,
          .pads = v.pads,
          .pad_slots = v.pad_slots};
}

struct CommViewRules {
  int max_world_size = 0;
  // The pad slots a world of this size needs, and how they are made up (only on failure, for
  // the message: "16 blocks x world size").
  size_t (*needed_pad_slots)(int world_size) = nullptr;
  std::string (*pad_layout)(int world_size) = nullptr;
};

// INVALID_ARGUMENT naming the offending value and what is allowed when the view cannot be
// used: world size or rank out of range, null arrays or pointers, too few pad slots. Reads
// only the shape (no pointer is dereferenced but the two arrays). Pure; thread-safe.
absl::Status CheckCommView(const CommViewShape& view, const CommViewRules& rules);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_COMM_VIEW_CHECK_H_
