#include "tools/commd-bench/options.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace commd::bench {
namespace {

// The names of the rows `take` keeps, joined by `sep`: the bench's flags come from the
// vocabulary (commd/vocabulary.h).
template <typename Row, size_t N, typename Name>
std::string Names(const Row (&rows)[N], const char* sep, Name name) {
  std::string out;
  for (const Row& r : rows) {
    const char* n = name(r);
    if (n != nullptr) absl::StrAppend(&out, out.empty() ? "" : sep, n);
  }
  return out;
}

std::string OpNames(const char* sep) {
  return Names(vocabulary::kCollectives, sep, [](const auto& r) { return r.bench; });
}
std::string TypeNames(const char* sep) {
  return Names(vocabulary::kDataTypes, sep,
               [](const auto& r) { return r.collective() ? r.nccl : nullptr; });
}
std::string RedopNames(const char* sep) {
  return Names(vocabulary::kReduceOps, sep, [](const auto& r) { return r.name; });
}

void Usage(FILE* out) {
  std::fprintf(out, R"(usage: commd-bench [flags]

Runs a host collective over commd symmetric memory with -n rank processes and prints one
row per size: size (bytes), count (elements), type, redop, algorithm, time (us, slowest
rank's mean per iteration), algbw and busbw (GB/s, nccl-tests' definitions), #wrong.
With --path sdk,kernel a row shows instead each path's algorithm and median time over the
rounds (us, slowest rank's mean per iteration in each round) and the median, lowest and
highest of the rounds' sdk/kernel ratios.
All-reduce rows from 64 KiB also show the machine's busbw ceiling at that size, measured before
the sweep (a copy and an in-place read+write pass, a thread per rank up to one per core),
and their %% of it.

  --op NAME          %s
                     (broadcast is from rank 0, alltoall has equal splits; PyTorch's
                     names, all_reduce, ..., also work)                 (default allreduce)
  --path P           sdk: time Group's collectives (Group::AllReduce, ...), as applications
                     call them; kernel: the host kernels straight over the same symmetric
                     buffers, without the SDK (its floor); sdk,kernel: both, interleaved
                     in --rounds rounds per size on the same daemon and buffers (default sdk)
      --rounds R     with --path sdk,kernel: rounds per size, 1..1000; each round times a
                     block of -i calls on each path, in alternating order   (default 7)
  -n, --ranks N      rank processes, 1..%d                              (default 2)
  -b, --minbytes S   smallest size, bytes; K/M/G suffixes (1024-based)  (default 8)
  -e, --maxbytes S   largest size, 1..4G                                (default 64M)
  -f, --stepfactor F multiply the size by F each step, 1.01..1024       (default 2)
  -w, --warmup N     warm-up iterations per size, 0..100000             (default 5)
  -i, --iters N      timed iterations per size, 1..1000000              (default 20)
  -d, --datatype T   %s
                     (also float32, fp32, float16, fp16, bf16, ...)     (default float)
  -o, --redop OP     %s                              (default sum)
  -a, --algo A       auto | oneshot | twoshot (all-reduce, --path kernel only) (default auto)
      --one-shot-max-read-bytes S  auto: one-shot while bytes x ranks <= S, as the daemon's
                     collectives.one_shot_max_read_bytes; a private daemon gets this value
                     (default 4K, the daemon's default)
      --tensors N    allreduce_coalesced: equal tensors per call, 1..%d  (default 8)
  -c, --check        after timing, run once more on known inputs and count wrong elements
      --runtime-dir D  use the daemon listening there; default: start a private one
      --csv          comma-separated rows instead of the table
  -h, --help         this text

Sizes: all-reduce: bytes per rank; all-gather: bytes of the gathered output;
reduce-scatter: bytes of the input per rank; coalesced: bytes of all tensors per rank. Each
size is rounded down to a whole number of elements (times the rank count for all-gather and
reduce-scatter, the tensor count for coalesced); sizes that round to 0 are skipped.
busbw = algbw * 2(n-1)/n for all-reduce, algbw * (n-1)/n for all-gather, reduce-scatter and
all-to-all, algbw for broadcast.
All-reduce runs in place on the symmetric buffer, as Group::AllReduce does; all-gather and
reduce-scatter read one symmetric buffer and write another, on both paths.
Exit status: 0 ok, 1 a rank failed or --check found wrong elements, 2 bad flags.
)",
               OpNames(" | ").c_str(), kMaxRanks, TypeNames(" | ").c_str(),
               RedopNames(" | ").c_str(), kMaxTensors);
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

// A flag whose value is one of a few names; each name's value, with aliases.
template <typename T>
T NamedFlag(const std::string& flag, const std::string& v,
            std::initializer_list<std::pair<const char*, T>> names, const char* allowed) {
  for (const auto& [name, value] : names) {
    if (v == name) return value;
  }
  BadFlag(absl::StrCat(flag, " ", v, ": not one of ", allowed));
}

// A collective type by its name, nccl-tests' name or its short alias.
DataType DatatypeFlag(const std::string& flag, const std::string& v) {
  for (const vocabulary::DataTypeRow& r : vocabulary::kDataTypes) {
    if (!r.collective()) continue;
    for (const char* name : {r.name, r.nccl, r.alias}) {
      if (name != nullptr && v == name) return r.type;
    }
  }
  BadFlag(absl::StrCat(flag, " ", v, ": not one of ", TypeNames(", ")));
}

ReduceOp RedopFlag(const std::string& flag, const std::string& v) {
  ReduceOp op;
  if (!ReduceOpFromName(v, &op))
    BadFlag(absl::StrCat(flag, " ", v, ": not one of ", RedopNames(", ")));
  return op;
}

// A benchmarked collective by its bench name or PyTorch's, with or without underscores.
CollectiveOp OpFlag(const std::string& flag, const std::string& v) {
  const std::string bare = absl::StrReplaceAll(v, {{"_", ""}});
  for (const vocabulary::CollectiveRow& r : vocabulary::kCollectives) {
    if (r.bench == nullptr) continue;
    for (absl::string_view name : {r.bench, r.torch}) {
      if (v == name || bare == absl::StrReplaceAll(name, {{"_", ""}})) return r.op;
    }
  }
  BadFlag(absl::StrCat(flag, " ", v, ": not one of ", OpNames(", ")));
}

// The flags that only make sense together.
void CheckCombination(const Options& o) {
  if (o.min_bytes > o.max_bytes) {
    BadFlag(absl::StrCat("-b ", o.min_bytes, " is larger than -e ", o.max_bytes,
                         ": the smallest size must be at most the largest"));
  }
  if (o.path == Path::kSdk && o.algo != AlgoChoice::kAuto) {
    BadFlag(
        "--algo oneshot|twoshot needs --path kernel: the SDK chooses by the daemon's "
        "collectives.one_shot_max_read_bytes (--one-shot-max-read-bytes for a private daemon)");
  }
  if (o.rounds_set && !o.interleaved) {
    BadFlag(absl::StrCat("--rounds ", o.rounds, " needs --path sdk,kernel"));
  }
  if (o.interleaved && !o.runtime_dir.empty()) {
    BadFlag(
        "--path sdk,kernel with --runtime-dir: the kernel path could not know which all-reduce "
        "algorithm that daemon makes the SDK choose; use a private daemon");
  }
  if (CollectiveInfo(o.op).reduces() && !ReduceOpApplies(o.redop, o.dtype)) {
    BadFlag(absl::StrCat("-o ", ReduceOpName(o.redop), " is not defined on -d ",
                         DataTypeName(o.dtype), " (", ReduceOpName(o.redop),
                         IsFloatingPoint(o.dtype) ? " takes integer and bool types)"
                                                  : " takes every type but bool)"));
  }
  if (o.path == Path::kSdk && !o.runtime_dir.empty() && o.one_shot_max_read_bytes_set) {
    BadFlag(
        "--one-shot-max-read-bytes with --runtime-dir and --path sdk: that daemon's "
        "collectives.one_shot_max_read_bytes decides");
  }
}

}  // namespace

[[noreturn]] void BadFlag(const std::string& message) {
  std::fprintf(stderr, "commd-bench: %s (see --help)\n", message.c_str());
  std::exit(2);
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
      o.dtype = DatatypeFlag(flag, next());
    } else if (flag == "-o" || flag == "--redop") {
      o.redop = RedopFlag(flag, next());
    } else if (flag == "--op") {
      o.op = OpFlag(flag, next());
    } else if (flag == "--path") {
      const std::string v = next();
      o.interleaved = v == "sdk,kernel" || v == "kernel,sdk";
      o.path = o.interleaved
                   ? Path::kSdk
                   : NamedFlag<Path>(flag, v, {{"sdk", Path::kSdk}, {"kernel", Path::kKernel}},
                                     "sdk, kernel, sdk,kernel");
    } else if (flag == "--rounds") {
      o.rounds = IntFlag(flag, next(), 1, 1000);
      o.rounds_set = true;
    } else if (flag == "--tensors") {
      o.tensors = IntFlag(flag, next(), 1, kMaxTensors);
    } else if (flag == "-a" || flag == "--algo") {
      o.algo = NamedFlag<AlgoChoice>(flag, next(),
                                     {{"auto", AlgoChoice::kAuto},
                                      {"oneshot", AlgoChoice::kOneShot},
                                      {"one-shot", AlgoChoice::kOneShot},
                                      {"twoshot", AlgoChoice::kTwoShot},
                                      {"two-shot", AlgoChoice::kTwoShot}},
                                     "auto, oneshot, twoshot");
    } else if (flag == "--one-shot-max-read-bytes") {
      o.one_shot_max_read_bytes = SizeFlag(flag, next(), 0, size_t{1} << 40);
      o.one_shot_max_read_bytes_set = true;
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
  CheckCombination(o);
  return o;
}

std::vector<Size> Sizes(const Options& o) {
  std::vector<Size> out;
  if (o.op == CollectiveOp::kBarrier) {
    out.push_back({0, 0, 0});
    return out;
  }
  const size_t ts = DataTypeSize(o.dtype);
  size_t unit = ts;
  const bool split = o.op == CollectiveOp::kAllGather || o.op == CollectiveOp::kReduceScatter ||
                     o.op == CollectiveOp::kAllToAll;
  if (split) unit = ts * o.ranks;
  if (o.op == CollectiveOp::kAllReduceCoalesced) unit = ts * o.tensors;
  double s = static_cast<double>(o.min_bytes);
  size_t last = 0;
  while (s <= static_cast<double>(o.max_bytes) * (1 + 1e-9)) {
    const size_t bytes = static_cast<size_t>(s) / unit * unit;
    if (bytes > 0 && bytes != last) {
      const size_t count = bytes / ts;
      out.push_back({bytes, count, split ? count / o.ranks : count});
      last = bytes;
    }
    s *= o.factor;
  }
  return out;
}

const char* OpName(CollectiveOp op) {
  const char* name = CollectiveInfo(op).bench;
  return name != nullptr ? name : "?";
}

const char* PathName(Path path) { return path == Path::kSdk ? "sdk" : "kernel"; }

const char* PathNames(const Options& o) { return o.interleaved ? "sdk,kernel" : PathName(o.path); }

std::string PathCall(Path path, CollectiveOp op) {
  return absl::StrCat(path == Path::kSdk ? "Group::" : "kernels::", CollectiveInfo(op).sdk);
}

}  // namespace commd::bench
