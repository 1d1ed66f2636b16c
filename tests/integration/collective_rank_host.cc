// collective_rank's host-memory modes: the SDK's overloads on ordinary host memory (pointers
// and a staging buffer, run.in), checked against the same reference as the symmetric modes.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "commd/commd.h"
#include "common/control_block.h"
#include "tests/integration/collective_rank.h"

namespace collective_rank {

// Runs `mode` with user buffers as large as the symmetric ones (uint64: aligned for every type).
void WithHostMemory(Run& run, void (*mode)(Run&)) {
  run.host_memory = true;
  run.user_in.assign(run.in.size() / 8, 0);
  run.user_out.assign(run.in.size() / 8, 0);
  mode(run);
}
void HostMatrix(Run& run) { WithHostMemory(run, Matrix); }
void HostLarge(Run& run) { WithHostMemory(run, Large); }

// Input and output overlapping as torch's in-place forms do: all-gather from this rank's block
// of the output, reduce-scatter into this rank's chunk of the input, all-to-all in place.
void HostOverlapping(Run& run) {
  run.host_memory = true;
  run.user_in.assign(run.in.size() / 8, 0);
  const int rank = run.args.rank, world = run.args.world;
  auto* base = reinterpret_cast<char*>(run.user_in.data());
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
    const size_t n = 1001, block = n * Size(t);
    uint64_t tag = ++run.tag;
    Poison(base, run.bytes());
    for (size_t i = 0; i < n; ++i) Store(base + rank * block, i, t, Input(run, rank, tag, i, t));
    run.Check("all-gather in place", run.g.AllGather(base + rank * block, base, n, t, run.in));
    ExpectGathered(run, "all-gather in place", base, tag, n, t);
    tag = ++run.tag;
    for (size_t i = 0; i < n * world; ++i) Store(base, i, t, Input(run, rank, tag, i, t));
    run.Check("reduce-scatter in place",
              run.g.ReduceScatter(base, base + rank * block, n, t, ReduceOp::kMax, run.in));
    ExpectReduced(run, "reduce-scatter in place", base + rank * block, tag, rank * n, n, t,
                  ReduceOp::kMax);
    tag = ++run.tag;
    for (size_t i = 0; i < n * world; ++i) Store(base, i, t, Input(run, rank, tag, i, t));
    run.Check("all-to-all in place", run.g.AllToAll(base, base, n, t, run.in));
    ExpectExchanged(run, "all-to-all in place", base, tag, n, t);
  }
}

// Calls the host-memory overloads refuse with INVALID_ARGUMENT naming the value, none touching
// the user's memory or the staging buffer.
void HostInvalid(Run& run) {
  commd::Group& g = run.g;
  commd::SymmetricBuffer& staging = run.in;
  std::vector<float> in(64, 1.0f), out(64 * run.args.world, 7.0f);
  std::memset(staging.data(), 7, 16);
  const auto i32 = DataType::kInt32;
  const size_t fits = staging.size() / 4;
  const std::string id = std::to_string(staging.id());
  ExpectInvalid(run, "too large for staging",
                g.AllReduce(in.data(), out.data(), fits + 1, i32, ReduceOp::kSum, staging),
                ("count " + std::to_string(fits + 1) + " x int32 does not fit staging buffer " +
                 id + " of " + std::to_string(staging.size()) +
                 " bytes per rank (allowed: " + "count at most " + std::to_string(fits) + ")")
                    .c_str());
  ExpectInvalid(run, "reduce-scatter too large for staging",
                g.ReduceScatter(in.data(), out.data(), fits / run.args.world + 1, i32,
                                ReduceOp::kSum, staging),
                ("x world size " + std::to_string(run.args.world) + " does not fit").c_str());
  ExpectInvalid(run, "null input",
                g.AllReduce(nullptr, out.data(), 4, i32, ReduceOp::kSum, staging),
                "all-reduce input is null (allowed: non-null for count > 0)");
  ExpectInvalid(run, "null output", g.AllGather(in.data(), nullptr, 4, i32, staging),
                "all-gather output is null");
  ExpectInvalid(run, "null broadcast buffer", g.Broadcast(nullptr, 4, i32, 0, staging),
                "broadcast buffer is null");
  ExpectInvalid(run, "misaligned",
                g.AllToAll(reinterpret_cast<char*>(in.data()) + 2, out.data(), 4,
                           DataType::kFloat32, staging),
                "is not aligned to the element size 4");
  const int other = (run.args.rank + 1) % run.args.world;
  ExpectInvalid(run, "input in staging",
                g.AllReduce(staging.data(), out.data(), 4, i32, ReduceOp::kSum, staging),
                ("overlaps rank " + std::to_string(run.args.rank) + "'s part of staging buffer " +
                 id + "; allowed: memory outside the staging buffer")
                    .c_str());
  ExpectInvalid(run, "output in a peer's staging",
                g.ReduceScatter(in.data(), staging.peer(other), 4, i32, ReduceOp::kSum, staging),
                "reduce-scatter output [0x");
  ExpectInvalid(
      run, "broadcast buffer straddling staging",
      g.Broadcast(static_cast<char*>(staging.data()) + staging.size() - 8, 4, i32, 0, staging),
      ("overlaps rank " + std::to_string(run.args.rank)).c_str());
  ExpectInvalid(run, "staging of another call's output",
                g.AllGather(in.data(), run.out.data(), 4, i32, run.out), "overlaps rank");
  auto other_group =
      run.client.JoinGroup({.name = "other", .rank = run.args.rank, .world_size = run.args.world});
  if (!other_group.ok()) return run.Fail("join other: " + other_group.status().ToString());
  auto foreign = (*other_group)->AllocateSymmetric(64);
  if (!foreign.ok()) return run.Fail("alloc other");
  ExpectInvalid(run, "foreign staging", g.AllToAll(in.data(), out.data(), 1, i32, **foreign),
                "all-to-all staging buffer");
  run.Check("count 0 with null pointers",
            g.AllReduce(nullptr, nullptr, 0, i32, ReduceOp::kSum, staging));
  if (static_cast<unsigned char*>(staging.data())[0] != 7 || in[0] != 1.0f || out[0] != 7.0f)
    run.Fail("an invalid host-memory call touched memory");
  // No entry for the refused calls; one for the empty call and one for a valid one, whose input
  // bytes are the reduce-scatter's world x count as on symmetric buffers.
  const auto* c = reinterpret_cast<const commd::ControlBlockCounters*>(
      static_cast<const char*>(g.control_block()) + commd::kCountersOffset);
  run.Check("valid",
            g.ReduceScatter(out.data(), in.data(), 5, DataType::kFloat32, ReduceOp::kSum, staging));
  if (c->collectives != 2 || c->abandoned != 0 || c->bytes != 5 * 4 * uint64_t(run.args.world))
    run.Fail("entries: " + std::to_string(c->collectives) + " completed, " +
             std::to_string(c->abandoned) + " abandoned, " + std::to_string(c->bytes) + " bytes");
}

// Policy FAIL (GroupOptions): NaN in rank 1's host memory gives DATA_LOSS on every rank naming
// it, counted where it was; the next clean call (in place) works.
void HostNanFail(Run& run) {
  std::vector<float> in(64, 1.0f), out(64, 0.0f);
  if (run.args.rank == 1) in[9] = NAN;
  uint64_t here = 99;
  commd::CollectiveOptions o{.nonfinite_count = &here};
  const absl::Status s =
      run.g.AllReduce(in.data(), out.data(), 64, DataType::kFloat32, ReduceOp::kSum, run.in, o);
  if (s.code() != absl::StatusCode::kDataLoss ||
      s.message().find("first rank 1") == absl::string_view::npos ||
      here != (run.args.rank == 1 ? 1u : 0u))
    run.Fail("host nan_fail: " + s.ToString() + " here " + std::to_string(here));
  in[9] = 1.0f;
  run.Check("host nan_fail clean",
            run.g.AllReduce(in.data(), in.data(), 64, DataType::kFloat32, ReduceOp::kSum, run.in));
  if (in[9] != static_cast<float>(run.args.world)) run.Fail("host nan_fail clean sum");
}

}  // namespace collective_rank
