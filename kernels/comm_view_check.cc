#include "kernels/comm_view_check.h"

#include "absl/strings/str_cat.h"

namespace commd::kernels {

absl::Status CheckCommView(const CommViewShape& view, const CommViewRules& rules) {
  if (view.world_size < 1 || view.world_size > rules.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", view.world_size, " is out of range [1, ", rules.max_world_size, "]"));
  }
  if (view.rank < 0 || view.rank >= view.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", view.rank, " is out of range [0, ", view.world_size - 1, "]"));
  }
  if (view.data == nullptr || view.pads == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the view's ", view.data == nullptr ? "data" : "pads",
                     " array is null; allowed: ", view.world_size, " non-null pointers"));
  }
  for (int p = 0; p < view.world_size; ++p) {
    if (view.data[p] == nullptr || view.pads[p] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", p, "'s ", view.data[p] == nullptr ? "data region" : "signal pad",
          " pointer is null; allowed: non-null for every rank in [0, ", view.world_size - 1, "]"));
    }
  }
  const size_t needed = rules.needed_pad_slots(view.world_size);
  if (view.pad_slots < needed) {
    return absl::InvalidArgumentError(absl::StrCat("signal pad of ", view.pad_slots,
                                                   " slots is too small; need at least ", needed,
                                                   " (", rules.pad_layout(view.world_size), ")"));
  }
  return absl::OkStatus();
}

}  // namespace commd::kernels
