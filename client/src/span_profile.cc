// The spanning groups' profile: see span_profile.h.
#include "client/src/span_profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace commd {

std::unique_ptr<SpanProfile> SpanProfile::FromEnv(std::string group, int global_rank) {
  const char* on = std::getenv("COMMD_SPAN_PROFILE");
  if (on == nullptr || *on == '\0' || std::string_view(on) == "0") return nullptr;
  return std::make_unique<SpanProfile>(std::move(group), global_rank);
}

SpanProfile::~SpanProfile() {
  for (const auto& [key, t] : totals_) {
    const auto& [kind, bytes, staged] = key;
    std::fprintf(stderr,
                 "commd span profile: group %s global rank %d: %s %zu B %s: %llu calls, "
                 "%.1f us per call, %.1f us of it between nodes\n",
                 group_.c_str(), global_rank_, std::string(CollectiveName(kind)).c_str(), bytes,
                 staged ? "staged" : "in place", static_cast<unsigned long long>(t.calls),
                 static_cast<double>(t.total_ns) / 1e3 / static_cast<double>(t.calls),
                 static_cast<double>(t.across_ns) / 1e3 / static_cast<double>(t.calls));
  }
}

int64_t SpanProfile::Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SpanProfile::Call(const CollectiveCall& call, size_t bytes, int64_t since, int64_t across_ns) {
  Totals& t = totals_[{call.kind, bytes, call.host_memory}];
  ++t.calls;
  t.total_ns += Now() - since;
  t.across_ns += across_ns;
}

}  // namespace commd
