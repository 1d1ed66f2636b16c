// The machine's limit for a host all-reduce, measured in the same run as the sweep: a copy
// and an in-place read+write pass, each by one thread per rank (at most one per core) over
// that rank's bytes. An in-place all-reduce must read and write every rank's buffer at least
// once (the read+write pass); out of place, read every input and write every output (the
// copy). Whichever of the two is faster bounds every algorithm.
//
//   Ceiling c = MeasureCeiling(64 << 20, 2);
//   double limit = AllReduceBusBwCeiling(c, 2);   // GB/s of busbw; rows print busbw / limit
#ifndef COMMD_TOOLS_COMMD_BENCH_CEILING_H_
#define COMMD_TOOLS_COMMD_BENCH_CEILING_H_

#include <cstddef>

namespace commd::bench {

struct Ceiling {
  double copy_gbps = 0;        // bytes copied per second, all threads together
  double read_write_gbps = 0;  // bytes updated in place per second, all threads together
};

// Best of a few timed rounds; each round lasts at least a few milliseconds.
Ceiling MeasureCeiling(size_t bytes_per_rank, int ranks);

// The busbw (nccl-tests' definition, algbw x 2(n-1)/n) of an all-reduce that moves exactly
// the least memory traffic at the faster of the two rates: n buffers of S bytes in
// t = n S / rate, so busbw = rate x 2(n-1)/n^2.
double AllReduceBusBwCeiling(const Ceiling& c, int ranks);

}  // namespace commd::bench

#endif  // COMMD_TOOLS_COMMD_BENCH_CEILING_H_
