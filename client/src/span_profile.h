// Internal to the SDK: where a spanning group's calls spend their time, when
// COMMD_SPAN_PROFILE is set on every rank of the node (a diagnostic, docs/cluster.md): per
// collective and size, the calls, their time in all, and the part of it between nodes: the
// leader's exchanges with the other nodes (which the other local ranks wait out at a barrier)
// and the slowest lane's, connecting included. The rest is the node-local phase. Printed to
// stderr when the group goes. Off: one branch per call.
//
//   auto profile = SpanProfile::FromEnv(group, global_rank);  // null unless set
//   { SpanProfile::Timer t(&ns); gloo::allreduce(opts); }      // adds the exchange's time
//   profile->Call(call, bytes, start, ns);
//
// Not thread-safe: the group's calling thread only.
#ifndef COMMD_CLIENT_SRC_SPAN_PROFILE_H_
#define COMMD_CLIENT_SRC_SPAN_PROFILE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "client/src/collective_call.h"

namespace commd {

class SpanProfile {
 public:
  // Null unless COMMD_SPAN_PROFILE is set (and not "0").
  static std::unique_ptr<SpanProfile> FromEnv(std::string group, int global_rank);
  SpanProfile(std::string group, int global_rank)
      : group_(std::move(group)), global_rank_(global_rank) {}
  ~SpanProfile();  // prints the totals
  SpanProfile(const SpanProfile&) = delete;
  SpanProfile& operator=(const SpanProfile&) = delete;

  // Steady-clock nanoseconds.
  static int64_t Now();
  // One call of `bytes` that began at `since`, `across_ns` of it between nodes.
  void Call(const CollectiveCall& call, size_t bytes, int64_t since, int64_t across_ns);

  // Adds the time until it goes to `*ns` (nothing when null).
  class Timer {
   public:
    explicit Timer(int64_t* ns) : ns_(ns), start_(ns != nullptr ? Now() : 0) {}
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    ~Timer() {
      if (ns_ != nullptr) *ns_ += Now() - start_;
    }

   private:
    int64_t* ns_;
    int64_t start_;
  };

 private:
  struct Totals {
    uint64_t calls = 0;
    int64_t total_ns = 0, across_ns = 0;
  };
  const std::string group_;
  const int global_rank_;
  std::map<std::tuple<CollectiveOp, size_t, bool>, Totals> totals_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_SPAN_PROFILE_H_
