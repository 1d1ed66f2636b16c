// commd-bench's command line: what to run (collective, path, sizes, type) and how to print.
//
//   const Options o = ParseFlags(argc, argv);   // exits 2 with a message on a bad flag
//   for (const Size& s : Sizes(o)) ...
//
// Pure functions but for ParseFlags, which prints and exits on --help and on bad flags.
#ifndef COMMD_TOOLS_COMMD_BENCH_OPTIONS_H_
#define COMMD_TOOLS_COMMD_BENCH_OPTIONS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "commd/collective_op.h"
#include "kernels/types.h"

namespace commd::bench {

// sdk: Group's collectives, as an application calls them (argument checks, the flight
// recorder, the group's settings). kernel: kernels/host straight over the same symmetric
// buffers, the floor the SDK adds to.
enum class Path { kSdk, kKernel };
enum class AlgoChoice { kAuto, kOneShot, kTwoShot };

inline constexpr int kMaxRanks = 64;
inline constexpr size_t kMaxBytes = size_t{1} << 32;  // 4 GiB per rank buffer
inline constexpr int kMaxTensors = 1024;

struct Options {
  std::string runtime_dir;  // empty: a private daemon
  int ranks = 2;
  size_t min_bytes = 8;
  size_t max_bytes = size_t{64} << 20;
  double factor = 2;
  int warmup = 5;
  int iters = 20;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  CollectiveOp op = CollectiveOp::kAllReduce;  // one that --op names
  Path path = Path::kSdk;
  // --path sdk,kernel: both paths in one run on the same daemon, group and buffers, in
  // `rounds` alternating rounds per size (each path times its block of `iters` calls per
  // round); a row then shows each path's median and the median of the per-round ratios.
  bool interleaved = false;
  int rounds = 7;
  bool rounds_set = false;
  int tensors = 8;  // all-reduce coalesced: tensors per call
  AlgoChoice algo = AlgoChoice::kAuto;
  // The daemon's default of collectives.one_shot_max_read_bytes; a private daemon is started
  // with the value given here, so both paths choose the same algorithm.
  size_t one_shot_max_read_bytes = size_t{4} << 10;
  bool one_shot_max_read_bytes_set = false;
  bool check = false;
  bool csv = false;
};

// One row of the sweep.
struct Size {
  size_t bytes;     // as printed
  size_t count;     // elements as printed (of `bytes`)
  size_t per_rank;  // the collective's count argument (coalesced: of all tensors together)
  // All-reduce from 64 KiB: the machine's busbw limit at this size, measured before the
  // sweep (ceiling.h); 0 when not measured.
  double ceiling_busbw = 0;
};

Options ParseFlags(int argc, char** argv);
[[noreturn]] void BadFlag(const std::string& message);

// The sweep's sizes: each rounded down to whole elements (times the rank count for
// all-gather and reduce-scatter, times the tensor count for coalesced), sizes that round to
// 0 or repeat skipped. Barrier: one row of size 0.
std::vector<Size> Sizes(const Options& o);

const char* OpName(CollectiveOp op);
const char* PathName(Path path);
// The --path value: "sdk", "kernel" or "sdk,kernel".
const char* PathNames(const Options& o);
// What the path runs for `op`, for the header line: "Group::AllReduce", "kernels::AllReduce".
std::string PathCall(Path path, CollectiveOp op);

}  // namespace commd::bench

#endif  // COMMD_TOOLS_COMMD_BENCH_OPTIONS_H_
