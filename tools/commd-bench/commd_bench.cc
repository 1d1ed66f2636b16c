// commd-bench: host collective bandwidth and latency over a running commd, in the style of
// nccl-tests. Forks -n rank processes that each connect to the daemon, join one group,
// allocate one symmetric buffer and run the chosen collective over a size sweep.
//
//   commd-bench -n 2 -b 8 -e 64M -f 2 --op allreduce -d float -o sum -c
//
// Without --runtime-dir it starts its own daemon (the `commd` next to this binary, else the
// build tree's, else $PATH) on a temporary runtime dir and stops it at the end.
// Run `commd-bench --help` for every flag.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "commd/commd.h"
#include "common/control_block.h"
#include "common/symmetric_layout.h"
#include "kernels/float16.h"
#include "kernels/host/collectives.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace {

using commd::kernels::Algorithm;
using commd::kernels::DataType;
using commd::kernels::ReduceOp;

enum class Op { kAllReduce, kAllGather, kReduceScatter, kBarrier };
enum class AlgoChoice { kAuto, kOneShot, kTwoShot };

constexpr int kMaxRanks = 64;
constexpr size_t kMaxBytes = size_t{1} << 32;  // 4 GiB per rank buffer

struct Options {
  std::string runtime_dir;
  int ranks = 2;
  size_t min_bytes = 8;
  size_t max_bytes = size_t{64} << 20;
  double factor = 2;
  int warmup = 5;
  int iters = 20;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  Op op = Op::kAllReduce;
  AlgoChoice algo = AlgoChoice::kAuto;
  size_t oneshot_max_bytes = size_t{1} << 10;  // the 2-rank crossover (docs/PERFORMANCE.md)
  bool check = false;
  bool csv = false;
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "allreduce";
    case Op::kAllGather:
      return "allgather";
    case Op::kReduceScatter:
      return "reducescatter";
    case Op::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* TypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat16:
      return "half";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "?";
}

const char* RedopName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

void Usage(FILE* out) {
  std::fprintf(out, R"(usage: commd-bench [flags]

Runs a host collective over commd symmetric memory with -n rank processes and prints one
row per size: size (bytes), count (elements), type, redop, algorithm, time (us, slowest
rank's mean per iteration), algbw and busbw (GB/s, nccl-tests' definitions), #wrong.

  --op NAME          allreduce | allgather | reducescatter | barrier   (default allreduce)
  -n, --ranks N      rank processes, 1..%d                              (default 2)
  -b, --minbytes S   smallest size, bytes; K/M/G suffixes (1024-based)  (default 8)
  -e, --maxbytes S   largest size, 1..4G                                (default 64M)
  -f, --stepfactor F multiply the size by F each step, 1.01..1024       (default 2)
  -w, --warmup N     warm-up iterations per size, 0..100000             (default 5)
  -i, --iters N      timed iterations per size, 1..1000000              (default 20)
  -d, --datatype T   float | half | bfloat16 | int32 | int64            (default float)
  -o, --redop OP     sum | avg | min | max                              (default sum)
  -a, --algo A       auto | oneshot | twoshot (all-reduce only)         (default auto)
      --oneshot-max-bytes S  auto: one-shot up to this size, else two-shot (default 1K)
  -c, --check        after timing, run once more on known inputs and count wrong elements
      --runtime-dir D  use the daemon listening there; default: start a private one
      --csv          comma-separated rows instead of the table
  -h, --help         this text

Sizes: all-reduce: bytes per rank; all-gather: bytes of the gathered output;
reduce-scatter: bytes of the input per rank. Each size is rounded down to a whole number of
elements (times the rank count for all-gather and reduce-scatter); sizes that round to 0 are
skipped. busbw = algbw * 2(n-1)/n for all-reduce, algbw * (n-1)/n for all-gather and
reduce-scatter. All-reduce runs in place on the symmetric buffer, as Group::AllReduce does.
Exit status: 0 ok, 1 a rank failed or --check found wrong elements, 2 bad flags.
)",
               kMaxRanks);
}

[[noreturn]] void BadFlag(const std::string& message) {
  std::fprintf(stderr, "commd-bench: %s (see --help)\n", message.c_str());
  std::exit(2);
}

bool ParseSize(absl::string_view text, size_t* out) {
  uint64_t mult = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K':
      case 'k':
        mult = uint64_t{1} << 10;
        break;
      case 'M':
      case 'm':
        mult = uint64_t{1} << 20;
        break;
      case 'G':
      case 'g':
        mult = uint64_t{1} << 30;
        break;
      default:
        break;
    }
    if (mult != 1) text.remove_suffix(1);
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) return false;
  if (v > std::numeric_limits<uint64_t>::max() / mult) return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

int IntFlag(const std::string& flag, const std::string& text, int lo, int hi) {
  int v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    BadFlag(absl::StrCat(flag, " ", text, ": not an integer in ", lo, "..", hi));
  }
  return v;
}

size_t SizeFlag(const std::string& flag, const std::string& text, size_t lo, size_t hi) {
  size_t v = 0;
  if (!ParseSize(text, &v) || v < lo || v > hi) {
    BadFlag(absl::StrCat(flag, " ", text, ": not a size in ", lo, "..", hi,
                         " bytes (K/M/G suffixes allowed)"));
  }
  return v;
}

Options ParseFlags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_inline = false;
    if (flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos) {
      value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
      has_inline = true;
    }
    auto next = [&]() -> std::string {
      if (has_inline) return value;
      if (i + 1 >= argc) BadFlag(absl::StrCat(flag, " needs a value"));
      return argv[++i];
    };
    if (flag == "-h" || flag == "--help") {
      Usage(stdout);
      std::exit(0);
    } else if (flag == "-n" || flag == "--ranks") {
      o.ranks = IntFlag(flag, next(), 1, kMaxRanks);
    } else if (flag == "-b" || flag == "--minbytes") {
      o.min_bytes = SizeFlag(flag, next(), 1, kMaxBytes);
    } else if (flag == "-e" || flag == "--maxbytes") {
      o.max_bytes = SizeFlag(flag, next(), 1, kMaxBytes);
    } else if (flag == "-f" || flag == "--stepfactor") {
      const std::string v = next();
      double f = 0;
      if (!absl::SimpleAtod(v, &f) || !(f >= 1.01 && f <= 1024)) {
        BadFlag(absl::StrCat(flag, " ", v, ": not a number in 1.01..1024"));
      }
      o.factor = f;
    } else if (flag == "-w" || flag == "--warmup") {
      o.warmup = IntFlag(flag, next(), 0, 100000);
    } else if (flag == "-i" || flag == "--iters") {
      o.iters = IntFlag(flag, next(), 1, 1000000);
    } else if (flag == "-d" || flag == "--datatype") {
      const std::string v = next();
      if (v == "float" || v == "fp32" || v == "float32")
        o.dtype = DataType::kFloat32;
      else if (v == "half" || v == "fp16" || v == "float16")
        o.dtype = DataType::kFloat16;
      else if (v == "bfloat16" || v == "bf16")
        o.dtype = DataType::kBFloat16;
      else if (v == "int32" || v == "int")
        o.dtype = DataType::kInt32;
      else if (v == "int64")
        o.dtype = DataType::kInt64;
      else
        BadFlag(absl::StrCat(flag, " ", v, ": not one of float, half, bfloat16, int32, int64"));
    } else if (flag == "-o" || flag == "--redop") {
      const std::string v = next();
      if (v == "sum")
        o.redop = ReduceOp::kSum;
      else if (v == "avg")
        o.redop = ReduceOp::kAvg;
      else if (v == "min")
        o.redop = ReduceOp::kMin;
      else if (v == "max")
        o.redop = ReduceOp::kMax;
      else
        BadFlag(absl::StrCat(flag, " ", v, ": not one of sum, avg, min, max"));
    } else if (flag == "--op") {
      const std::string v = next();
      if (v == "allreduce" || v == "all_reduce")
        o.op = Op::kAllReduce;
      else if (v == "allgather" || v == "all_gather")
        o.op = Op::kAllGather;
      else if (v == "reducescatter" || v == "reduce_scatter")
        o.op = Op::kReduceScatter;
      else if (v == "barrier")
        o.op = Op::kBarrier;
      else
        BadFlag(absl::StrCat(flag, " ", v,
                             ": not one of allreduce, allgather, reducescatter, barrier"));
    } else if (flag == "-a" || flag == "--algo") {
      const std::string v = next();
      if (v == "auto")
        o.algo = AlgoChoice::kAuto;
      else if (v == "oneshot" || v == "one-shot")
        o.algo = AlgoChoice::kOneShot;
      else if (v == "twoshot" || v == "two-shot")
        o.algo = AlgoChoice::kTwoShot;
      else
        BadFlag(absl::StrCat(flag, " ", v, ": not one of auto, oneshot, twoshot"));
    } else if (flag == "--oneshot-max-bytes") {
      o.oneshot_max_bytes = SizeFlag(flag, next(), 0, kMaxBytes);
    } else if (flag == "-c" || flag == "--check") {
      // nccl-tests spells it "-c 1"; accept an optional 0/1.
      o.check = true;
      if (!has_inline && i + 1 < argc &&
          (std::strcmp(argv[i + 1], "0") == 0 || std::strcmp(argv[i + 1], "1") == 0)) {
        o.check = argv[++i][0] == '1';
      } else if (has_inline) {
        o.check = IntFlag(flag, value, 0, 1) == 1;
      }
    } else if (flag == "--runtime-dir") {
      o.runtime_dir = next();
      if (o.runtime_dir.empty()) BadFlag("--runtime-dir: empty path");
    } else if (flag == "--csv") {
      o.csv = true;
    } else {
      BadFlag(absl::StrCat("unknown flag ", flag));
    }
  }
  if (o.min_bytes > o.max_bytes) {
    BadFlag(absl::StrCat("-b ", o.min_bytes, " is larger than -e ", o.max_bytes,
                         ": the smallest size must be at most the largest"));
  }
  return o;
}

// ---------------------------------------------------------------------------------------
// Check values: small integers, exact in every type and in every sum of up to 64 ranks.

double InputValue(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 13) % 17 + 1); }

double ReadAs(DataType t, const std::byte* p, size_t i) {
  switch (t) {
    case DataType::kFloat32:
      return reinterpret_cast<const float*>(p)[i];
    case DataType::kFloat16:
      return commd::kernels::HalfToFloat(reinterpret_cast<const commd::kernels::Half*>(p)[i]);
    case DataType::kBFloat16:
      return commd::kernels::BFloat16ToFloat(
          reinterpret_cast<const commd::kernels::BFloat16*>(p)[i]);
    case DataType::kInt32:
      return reinterpret_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void WriteAs(DataType t, std::byte* p, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32:
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DataType::kFloat16:
      reinterpret_cast<commd::kernels::Half*>(p)[i] =
          commd::kernels::FloatToHalf(static_cast<float>(v));
      return;
    case DataType::kBFloat16:
      reinterpret_cast<commd::kernels::BFloat16*>(p)[i] =
          commd::kernels::FloatToBFloat16(static_cast<float>(v));
      return;
    case DataType::kInt32:
      reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case DataType::kInt64:
      reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      return;
  }
}

double Expected(ReduceOp op, DataType t, int world, size_t i) {
  double sum = 0, lo = 1e300, hi = -1e300;
  for (int r = 0; r < world; ++r) {
    const double v = InputValue(r, i);
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kMin:
      return lo;
    case ReduceOp::kMax:
      return hi;
    case ReduceOp::kAvg:
      if (t == DataType::kInt32 || t == DataType::kInt64) {
        return static_cast<double>(static_cast<int64_t>(sum) / world);
      }
      return sum / world;
  }
  return 0;
}

bool Close(DataType t, double got, double want) {
  double tol = 0;
  switch (t) {
    case DataType::kFloat32:
      tol = 1e-6;
      break;
    case DataType::kFloat16:
      tol = 1e-3;
      break;
    case DataType::kBFloat16:
      tol = 8e-3;
      break;
    default:
      return got == want;
  }
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// The abort word of this rank's control block: nonzero once the daemon aborts the group.
const uint32_t* AbortWord(const commd::Group& group) {
  if (group.control_block_bytes() < commd::kAbortOffset + sizeof(uint32_t)) return nullptr;
  return reinterpret_cast<const uint32_t*>(static_cast<const std::byte*>(group.control_block()) +
                                           commd::kAbortOffset);
}

// ---------------------------------------------------------------------------------------
// Shared between the ranks and the parent (MAP_SHARED, set up before fork).

struct SharedRow {
  double seconds[kMaxRanks];
  uint64_t wrong[kMaxRanks];
};

struct Shared {
  std::atomic<int> failed;
  std::atomic<uint64_t> wrong;  // --check: wrong elements over every row
  char error[512];
  SharedRow row;
};

struct Size {
  size_t bytes;     // as printed
  size_t count;     // elements as printed (of `bytes`)
  size_t per_rank;  // the kernel's count argument
};

std::vector<Size> Sizes(const Options& o) {
  const size_t ts = o.op == Op::kBarrier ? 1 : commd::kernels::DataTypeSize(o.dtype);
  const size_t unit = (o.op == Op::kAllGather || o.op == Op::kReduceScatter) ? ts * o.ranks : ts;
  std::vector<Size> out;
  if (o.op == Op::kBarrier) {
    out.push_back({0, 0, 0});
    return out;
  }
  double s = static_cast<double>(o.min_bytes);
  size_t last = 0;
  while (s <= static_cast<double>(o.max_bytes) * (1 + 1e-9)) {
    const size_t bytes = static_cast<size_t>(s) / unit * unit;
    if (bytes > 0 && bytes != last) {
      const size_t count = bytes / ts;
      const size_t per_rank = o.op == Op::kAllReduce ? count : count / o.ranks;
      out.push_back({bytes, count, per_rank});
      last = bytes;
    }
    s *= o.factor;
  }
  return out;
}

void Fail(Shared* shared, const std::string& message) {
  if (shared->failed.exchange(1) == 0) {
    std::snprintf(shared->error, sizeof(shared->error), "%s", message.c_str());
  }
  ::_exit(1);
}

// The bytes each rank's symmetric buffer needs for the whole sweep.
size_t BufferBytes(const Options& o, const std::vector<Size>& sizes) {
  size_t need = 64;
  const size_t ts = commd::kernels::DataTypeSize(o.dtype);
  for (const Size& s : sizes) {
    switch (o.op) {
      case Op::kAllReduce:
        need = std::max(need, s.per_rank * ts);
        break;
      case Op::kAllGather:
        need = std::max(need, s.per_rank * ts);
        break;
      case Op::kReduceScatter:
        need = std::max(need, s.per_rank * ts * o.ranks);
        break;
      case Op::kBarrier:
        break;
    }
  }
  return need;
}

class Rank {
 public:
  Rank(const Options& o, int rank, Shared* shared, const std::string& dir,
       const std::string& group_name)
      : o_(o), rank_(rank), shared_(shared), dir_(dir), group_name_(group_name) {}

  void Run(const std::vector<Size>& sizes) {
    auto client = commd::Client::Connect(
        {.runtime_dir = dir_, .job_id = "commd-bench", .connect_timeout = absl::Seconds(30)});
    if (!client.ok()) Fail(shared_, absl::StrCat("rank ", rank_, ": ", client.status().ToString()));
    auto group = (*client)->JoinGroup(
        {.name = group_name_, .rank = rank_, .world_size = o_.ranks, .timeout = absl::Minutes(2)});
    if (!group.ok()) Fail(shared_, absl::StrCat("rank ", rank_, ": ", group.status().ToString()));
    auto buf = (*group)->AllocateSymmetric(BufferBytes(o_, sizes));
    if (!buf.ok()) Fail(shared_, absl::StrCat("rank ", rank_, ": ", buf.status().ToString()));
    for (int p = 0; p < o_.ranks; ++p) {
      data_[p] = static_cast<std::byte*>((*buf)->peer(p));
      pads_[p] = (*buf)->signal_pad(p);
    }
    view_ = commd::kernels::HostCommView{.rank = rank_,
                                         .world_size = o_.ranks,
                                         .data = data_,
                                         .pads = pads_,
                                         .data_bytes = (*buf)->size(),
                                         .pad_slots = (*buf)->signal_pad_bytes() / 4,
                                         // `commctl abort` or a watchdog finding stops the run.
                                         .abort_word = AbortWord(**group)};
    const size_t ts = commd::kernels::DataTypeSize(o_.dtype);
    if (o_.op == Op::kAllGather) out_.resize(BufferBytes(o_, sizes) * o_.ranks);
    if (o_.op == Op::kReduceScatter) out_.resize(BufferBytes(o_, sizes) / o_.ranks + ts);
    // Touch every page the sweep uses once, so first-touch faults stay out of the timings.
    std::memset(data_[rank_], 0, view_.data_bytes);
    if (!out_.empty()) std::memset(out_.data(), 0, out_.size());
    Sync();

    for (const Size& s : sizes) {
      view_.deadline = absl::Now() + absl::Minutes(2);
      if (o_.check || o_.op != Op::kAllReduce) Fill(s);  // non-zero, finite inputs
      for (int i = 0; i < o_.warmup; ++i) Step(s);
      Sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o_.iters; ++i) Step(s);
      const auto t1 = std::chrono::steady_clock::now();
      shared_->row.seconds[rank_] = std::chrono::duration<double>(t1 - t0).count() / o_.iters;
      uint64_t wrong = 0;
      if (o_.check && o_.op != Op::kBarrier) {
        Fill(s);
        Sync();
        Step(s);
        wrong = Verify(s);
      }
      shared_->row.wrong[rank_] = wrong;
      Sync();  // every rank's figures are in
      if (rank_ == 0) PrintRow(s);
      Sync();  // rank 0 has read them
    }
  }

 private:
  void Sync() {
    const absl::Status st = commd::kernels::Barrier(view_);
    if (!st.ok()) Fail(shared_, absl::StrCat("rank ", rank_, ": ", st.ToString()));
  }

  Algorithm AlgoFor(size_t bytes) const {
    switch (o_.algo) {
      case AlgoChoice::kOneShot:
        return Algorithm::kOneShot;
      case AlgoChoice::kTwoShot:
        return Algorithm::kTwoShot;
      case AlgoChoice::kAuto:
        break;
    }
    return bytes <= o_.oneshot_max_bytes ? Algorithm::kOneShot : Algorithm::kTwoShot;
  }

  void Step(const Size& s) {
    absl::Status st;
    std::byte* mine = data_[rank_];
    switch (o_.op) {
      case Op::kAllReduce:
        st = commd::kernels::AllReduce(view_, mine, mine, s.per_rank, o_.dtype, o_.redop,
                                       AlgoFor(s.bytes), commd::kernels::NanCheck::kOff, nullptr);
        break;
      case Op::kAllGather:
        st = commd::kernels::AllGather(view_, mine, out_.data(), s.per_rank, o_.dtype,
                                       commd::kernels::NanCheck::kOff, nullptr);
        break;
      case Op::kReduceScatter:
        st = commd::kernels::ReduceScatter(view_, mine, out_.data(), s.per_rank, o_.dtype, o_.redop,
                                           commd::kernels::NanCheck::kOff, nullptr);
        break;
      case Op::kBarrier:
        st = commd::kernels::Barrier(view_);
        break;
    }
    if (!st.ok()) Fail(shared_, absl::StrCat("rank ", rank_, ": ", st.ToString()));
  }

  // This rank's input for size `s`, element i of the rank-major input (all-gather: its own
  // contribution only).
  void Fill(const Size& s) {
    std::byte* mine = data_[rank_];
    const size_t n = o_.op == Op::kReduceScatter ? s.per_rank * o_.ranks : s.per_rank;
    for (size_t i = 0; i < n; ++i) WriteAs(o_.dtype, mine, i, InputValue(rank_, i));
  }

  uint64_t Verify(const Size& s) const {
    uint64_t wrong = 0;
    switch (o_.op) {
      case Op::kAllReduce:
        for (size_t i = 0; i < s.per_rank; ++i) {
          if (!Close(o_.dtype, ReadAs(o_.dtype, data_[rank_], i),
                     Expected(o_.redop, o_.dtype, o_.ranks, i))) {
            ++wrong;
          }
        }
        break;
      case Op::kAllGather:
        for (int p = 0; p < o_.ranks; ++p) {
          for (size_t i = 0; i < s.per_rank; ++i) {
            if (ReadAs(o_.dtype, out_.data(), p * s.per_rank + i) != InputValue(p, i)) ++wrong;
          }
        }
        break;
      case Op::kReduceScatter:
        for (size_t i = 0; i < s.per_rank; ++i) {
          const size_t g = static_cast<size_t>(rank_) * s.per_rank + i;
          if (!Close(o_.dtype, ReadAs(o_.dtype, out_.data(), i),
                     Expected(o_.redop, o_.dtype, o_.ranks, g))) {
            ++wrong;
          }
        }
        break;
      case Op::kBarrier:
        break;
    }
    return wrong;
  }

  void PrintRow(const Size& s) const {
    double worst = 0;
    uint64_t wrong = 0;
    for (int r = 0; r < o_.ranks; ++r) {
      worst = std::max(worst, shared_->row.seconds[r]);
      wrong += shared_->row.wrong[r];
    }
    const double us = worst * 1e6;
    const double algbw = s.bytes / worst / 1e9;
    const int n = o_.ranks;
    double factor = 0;
    switch (o_.op) {
      case Op::kAllReduce:
        factor = 2.0 * (n - 1) / n;
        break;
      case Op::kAllGather:
      case Op::kReduceScatter:
        factor = static_cast<double>(n - 1) / n;
        break;
      case Op::kBarrier:
        break;
    }
    const char* algo = o_.op != Op::kAllReduce
                           ? "-"
                           : (AlgoFor(s.bytes) == Algorithm::kOneShot ? "oneshot" : "twoshot");
    const bool bw = o_.op != Op::kBarrier;
    const char* type = bw ? TypeName(o_.dtype) : "-";
    const char* redop =
        (o_.op == Op::kAllReduce || o_.op == Op::kReduceScatter) ? RedopName(o_.redop) : "-";
    shared_->wrong += wrong;
    const std::string wrong_text = o_.check && bw ? absl::StrCat(wrong) : "N/A";
    if (o_.csv) {
      std::printf("%s,%d,%zu,%zu,%s,%s,%s,%.3f,%.4f,%.4f,%s\n", OpName(o_.op), n, s.bytes, s.count,
                  type, redop, algo, us, bw ? algbw : 0.0, bw ? algbw * factor : 0.0,
                  wrong_text.c_str());
    } else {
      std::printf("%12zu %12zu %9s %6s %8s %11.2f %8.3f %8.3f %7s\n", s.bytes, s.count, type, redop,
                  algo, us, bw ? algbw : 0.0, bw ? algbw * factor : 0.0, wrong_text.c_str());
    }
    std::fflush(stdout);
  }

  const Options& o_;
  int rank_;
  Shared* shared_;
  std::string dir_;
  std::string group_name_;
  std::byte* data_[kMaxRanks] = {};
  uint32_t* pads_[kMaxRanks] = {};
  commd::kernels::HostCommView view_;
  std::vector<std::byte> out_;
};

// ---------------------------------------------------------------------------------------
// A private daemon.

std::string FindDaemon() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = 0;
    std::string dir(self);
    dir = dir.substr(0, dir.rfind('/'));
    if (::access((dir + "/commd").c_str(), X_OK) == 0) return dir + "/commd";
  }
#ifdef COMMD_BUILD_DAEMON
  if (::access(COMMD_BUILD_DAEMON, X_OK) == 0) return COMMD_BUILD_DAEMON;
#endif
  return "commd";  // execvp searches $PATH
}

struct PrivateDaemon {
  pid_t pid = -1;
  std::string dir;
  std::string root;

  bool Start() {
    char tmpl[] = "/tmp/commd-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::perror("commd-bench: mkdtemp");
      return false;
    }
    root = tmpl;
    dir = root + "/run";
    const std::string log = root + "/commd.log";
    const std::string bin = FindDaemon();
    pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      ::dup2(STDERR_FILENO, STDOUT_FILENO);
      ::execlp(bin.c_str(), bin.c_str(), "--runtime-dir", dir.c_str(), "--metrics-address",
               "127.0.0.1:0", static_cast<char*>(nullptr));
      std::fprintf(stderr, "commd-bench: cannot run %s: %s\n", bin.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    return pid > 0;
  }

  void Stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int status = 0;
      ::waitpid(pid, &status, 0);
      pid = -1;
    }
    if (!root.empty()) {
      const std::string cmd = "rm -rf '" + root + "'";
      if (std::system(cmd.c_str()) != 0) {
        std::fprintf(stderr, "commd-bench: could not remove %s\n", root.c_str());
      }
    }
  }

  std::string Log() const {
    std::string out;
    if (FILE* f = std::fopen((root + "/commd.log").c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
      std::fclose(f);
    }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseFlags(argc, argv);
  const std::vector<Size> sizes = Sizes(o);
  if (sizes.empty()) {
    BadFlag(absl::StrCat("no size in -b ", o.min_bytes, " .. -e ", o.max_bytes,
                         " holds a whole element", o.op == Op::kAllReduce ? "" : " per rank",
                         " of ", TypeName(o.dtype)));
  }

  PrivateDaemon daemon;
  std::string dir = o.runtime_dir;
  if (dir.empty()) {
    if (!daemon.Start()) return 1;
    dir = daemon.dir;
  }

  auto* shared = static_cast<Shared*>(
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) {
    std::perror("commd-bench: mmap");
    daemon.Stop();
    return 1;
  }
  new (shared) Shared{};

  std::printf("# commd-bench: %s, %d ranks, warm-up %d, iterations %d, %s\n", OpName(o.op), o.ranks,
              o.warmup, o.iters,
              o.runtime_dir.empty() ? "private daemon" : ("daemon at " + dir).c_str());
  if (o.csv) {
    std::printf("op,ranks,size,count,type,redop,algo,time_us,algbw_gbps,busbw_gbps,wrong\n");
  } else {
    std::printf("%12s %12s %9s %6s %8s %11s %8s %8s %7s\n", "size(B)", "count", "type", "redop",
                "algo", "time(us)", "algbw", "busbw", "#wrong");
    std::printf("%12s %12s %9s %6s %8s %11s %8s %8s %7s\n", "", "(elements)", "", "", "", "",
                "(GB/s)", "(GB/s)", "");
  }
  std::fflush(stdout);

  const std::string group_name = absl::StrCat("commd-bench-", ::getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      Rank(o, r, shared, dir, group_name).Run(sizes);
      std::fflush(stdout);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  size_t left = pids.size();
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    if (pid < 0) break;
    if (std::find(pids.begin(), pids.end(), pid) == pids.end()) {
      if (pid == daemon.pid) {
        daemon.pid = -1;
        if (shared->failed.exchange(1) == 0) {
          std::snprintf(shared->error, sizeof(shared->error), "the private commd exited");
        }
        ok = false;
        for (pid_t p : pids) ::kill(p, SIGKILL);
      }
      continue;
    }
    --left;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (ok) {
        // One rank failing leaves its peers waiting: stop them.
        for (pid_t p : pids) ::kill(p, SIGKILL);
      }
      ok = false;
    }
  }
  if (!ok) {
    std::fprintf(stderr, "commd-bench: %s\n",
                 shared->failed.load() ? shared->error : "a rank process died");
    if (!o.runtime_dir.empty() || daemon.pid < 0) {
      // nothing more to say
    } else {
      std::fprintf(stderr, "commd log:\n%s", daemon.Log().c_str());
    }
  }
  daemon.Stop();
  if (ok && shared->wrong.load() > 0) {
    std::fprintf(stderr, "commd-bench: --check found %llu wrong elements\n",
                 static_cast<unsigned long long>(shared->wrong.load()));
    ok = false;
  }
  return ok ? 0 : 1;
}
