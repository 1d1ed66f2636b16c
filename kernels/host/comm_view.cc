#include "kernels/host/comm_view.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/symmetric_layout.h"
#include "kernels/comm_view_check.h"

namespace commd::kernels {
namespace {

// The CPU path's channels and the exchange area after every channel (symmetric_layout.h).
constexpr CommViewRules kHostRules{
    .max_world_size = kMaxWorldSize,
    .needed_pad_slots =
        [](int world_size) { return SignalPadBytes(world_size) / sizeof(uint32_t); },
    .pad_layout =
        [](int world_size) {
          return absl::StrCat(kSignalPadChannels, " channels x world size ", world_size,
                              ", then an exchange area of one line and ", 2 * world_size,
                              " slots of ", ExchangeSlotBytes(world_size), " bytes");
        }};

}  // namespace

absl::Status ValidateHostCommView(const HostCommView& view) {
  return CheckCommView(ShapeOfView(view), kHostRules);
}

}  // namespace commd::kernels
