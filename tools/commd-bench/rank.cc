#include "tools/commd-bench/rank.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "commd/commd.h"
#include "kernels/element_ops.h"
#include "tools/commd-bench/collective_path.h"

namespace commd::bench {
namespace {

// ---------------------------------------------------------------------------------------
// Check values: small integers, exact in every type and in every sum of up to 64 ranks (the
// narrow integers and bool compare with the sum as they store it: wrapped, or 0 or 1).

double InputValue(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 13) % 17 + 1); }

// Element i of type t at p, through the kernels' own accumulator conversions: integers and
// bool as int64 (stored as their low bits; bool as 0 or 1), floating types through float or
// double.
double ReadAs(DataType t, const std::byte* p, size_t i) {
  double v = 0;
  kernels::DispatchType(t, [&]<typename T>() {
    v = static_cast<double>(kernels::ToAcc(reinterpret_cast<const T*>(p)[i]));
  });
  return v;
}

void WriteAs(DataType t, std::byte* p, size_t i, double v) {
  kernels::DispatchType(t, [&]<typename T>() {
    reinterpret_cast<T*>(p)[i] = kernels::FromAcc<T>(static_cast<kernels::AccType<T>>(v));
  });
}

// `v` as type t holds it, read back: what a copy of it must read.
double AsStored(DataType t, double v) {
  alignas(8) std::byte b[8];
  WriteAs(t, b, 0, v);
  return ReadAs(t, b, 0);
}

// The ranks' inputs folded with `op` in rank order in the type's accumulator, as commd/
// vocabulary.h defines product and the bitwise ops (products wrap or overflow, which a double
// sum would not follow).
double Folded(ReduceOp op, DataType t, int world, size_t i) {
  double v = 0;
  kernels::DispatchType(t, [&]<typename T>() {
    kernels::DispatchReduceOp<T>(op, [&]<ReduceOp Op>() {
      const auto input = [&](int r) {
        return kernels::ToAcc(
            kernels::FromAcc<T>(static_cast<kernels::AccType<T>>(InputValue(r, i))));
      };
      kernels::AccType<T> acc = input(0);
      for (int r = 1; r < world; ++r) acc = kernels::Combine<Op>(acc, input(r));
      v = static_cast<double>(kernels::ToAcc(kernels::FromAcc<T>(acc)));
    });
  });
  return v;
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
      return AsStored(t, sum);
    case ReduceOp::kMin:
      return AsStored(t, lo);
    case ReduceOp::kMax:
      return AsStored(t, hi);
    case ReduceOp::kAvg:
      if (!IsFloatingPoint(t))
        return AsStored(t, static_cast<double>(static_cast<int64_t>(sum) / world));
      return sum / world;
    case ReduceOp::kProduct:
    case ReduceOp::kBAnd:
    case ReduceOp::kBOr:
    case ReduceOp::kBXor:
      return Folded(op, t, world, i);
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

bool Reduces(CollectiveOp op) { return CollectiveInfo(op).reduces(); }

// The bytes of each rank's input (and all-gather / reduce-scatter output) buffer for the
// whole sweep.
struct BufferSizes {
  size_t in = 64;
  size_t out = 0;
};

BufferSizes Need(const Options& o, const std::vector<Size>& sizes) {
  BufferSizes need;
  const size_t ts = DataTypeSize(o.dtype);
  for (const Size& s : sizes) {
    switch (o.op) {
      case CollectiveOp::kAllReduce:
      case CollectiveOp::kAllReduceCoalesced:
      case CollectiveOp::kBroadcast:
        need.in = std::max(need.in, s.per_rank * ts);
        break;
      case CollectiveOp::kAllToAll:
        need.in = std::max(need.in, s.per_rank * ts * o.ranks);
        need.out = std::max(need.out, s.per_rank * ts * o.ranks);
        break;
      case CollectiveOp::kAllGather:
        need.in = std::max(need.in, s.per_rank * ts);
        need.out = std::max(need.out, s.per_rank * ts * o.ranks);
        break;
      case CollectiveOp::kReduceScatter:
        need.in = std::max(need.in, s.per_rank * ts * o.ranks);
        need.out = std::max(need.out, s.per_rank * ts);
        break;
      default:  // barrier: no data
        break;
    }
  }
  return need;
}

class Rank {
 public:
  Rank(const Options& o, int rank, Shared* shared) : o_(o), rank_(rank), shared_(shared) {}

  void Run(const std::string& dir, const std::string& group_name, const std::vector<Size>& sizes) {
    auto client = Client::Connect(
        {.runtime_dir = dir, .job_id = "commd-bench", .connect_timeout = absl::Seconds(30)});
    if (!client.ok()) Die(client.status());
    client_ = std::move(*client);
    auto group = client_->JoinGroup(
        {.name = group_name, .rank = rank_, .world_size = o_.ranks, .timeout = absl::Minutes(2)});
    if (!group.ok()) Die(group.status());
    group_ = std::move(*group);
    const BufferSizes need = Need(o_, sizes);
    in_ = Allocate(need.in);
    if (need.out > 0) out_ = Allocate(need.out);
    const SymmetricBuffers bufs{.in = in_.get(), .out = out_.get()};
    path_ = MakeCollectivePath(o_, o_.path, *group_, bufs);
    if (o_.interleaved) kernel_path_ = MakeCollectivePath(o_, Path::kKernel, *group_, bufs);
    // Touch every page the sweep uses once, so first-touch faults stay out of the timings.
    std::memset(in_->data(), 0, in_->size());
    if (out_ != nullptr) std::memset(out_->data(), 0, out_->size());
    Sync();
    for (const Size& s : sizes) {
      if (o_.interleaved) {
        RunInterleaved(s);
      } else {
        RunSize(s);
      }
    }
  }

 private:
  [[noreturn]] void Die(const absl::Status& status) {
    Fail(shared_, absl::StrCat("rank ", rank_, ": ", status.ToString()));
  }

  std::unique_ptr<SymmetricBuffer> Allocate(size_t bytes) {
    auto buf = group_->AllocateSymmetric(bytes);
    if (!buf.ok()) Die(buf.status());
    return std::move(*buf);
  }

  // Between sizes, untimed: the group's barrier on both paths.
  void Sync() {
    if (absl::Status st = group_->Barrier(); !st.ok()) Die(st);
  }

  void Step(const Size& s) { Step(*path_, s); }
  void Step(CollectivePath& path, const Size& s) {
    if (absl::Status st = path.Step(s); !st.ok()) Die(st);
  }

  // The slowest rank's mean seconds per call of `iters` calls on `path`, every rank timing
  // the same block after a barrier.
  double TimeBlock(CollectivePath& path, const Size& s) {
    Sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) Step(path, s);
    const auto t1 = std::chrono::steady_clock::now();
    shared_->row.seconds[rank_] = std::chrono::duration<double>(t1 - t0).count() / o_.iters;
    Sync();  // every rank's figure is in
    double worst = 0;
    for (int r = 0; r < o_.ranks; ++r) worst = std::max(worst, shared_->row.seconds[r]);
    Sync();  // every rank has read them
    return worst;
  }

  // --path sdk,kernel: both paths warmed up, then `rounds` rounds of one timed block each,
  // the order alternating from round to round so that neither path always runs first.
  void RunInterleaved(const Size& s) {
    CollectivePath* paths[2] = {path_.get(), kernel_path_.get()};
    if (o_.check || o_.op != CollectiveOp::kAllReduce) Fill(s);
    for (CollectivePath* p : paths) {
      p->NewSize();
      for (int i = 0; i < o_.warmup; ++i) Step(*p, s);
    }
    std::vector<double> sdk, kernel, ratio;
    for (int round = 0; round < o_.rounds; ++round) {
      const bool sdk_first = round % 2 == 0;
      const double first = TimeBlock(*paths[sdk_first ? 0 : 1], s);
      const double second = TimeBlock(*paths[sdk_first ? 1 : 0], s);
      sdk.push_back(sdk_first ? first : second);
      kernel.push_back(sdk_first ? second : first);
      ratio.push_back(sdk.back() / kernel.back());
    }
    uint64_t wrong = 0;
    if (o_.check && o_.op != CollectiveOp::kBarrier) {
      for (CollectivePath* p : paths) {  // each path's result checked on its own
        Fill(s);
        Sync();
        Step(*p, s);
        wrong += Verify(s);
        Sync();
      }
    }
    shared_->row.wrong[rank_] = wrong;
    Sync();
    if (rank_ == 0) PrintInterleavedRow(s, sdk, kernel, ratio);
    Sync();
  }

  void RunSize(const Size& s) {
    path_->NewSize();
    if (o_.check || o_.op != CollectiveOp::kAllReduce) Fill(s);  // non-zero, finite inputs
    for (int i = 0; i < o_.warmup; ++i) Step(s);
    Sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) Step(s);
    const auto t1 = std::chrono::steady_clock::now();
    shared_->row.seconds[rank_] = std::chrono::duration<double>(t1 - t0).count() / o_.iters;
    uint64_t wrong = 0;
    if (o_.check && o_.op != CollectiveOp::kBarrier) {
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

  // This rank's input for size `s`, element i of the rank-major input (all-gather: its own
  // contribution only).
  void Fill(const Size& s) {
    auto* mine = static_cast<std::byte*>(in_->data());
    const bool wide = o_.op == CollectiveOp::kReduceScatter || o_.op == CollectiveOp::kAllToAll;
    const size_t n = wide ? s.per_rank * o_.ranks : s.per_rank;
    for (size_t i = 0; i < n; ++i) WriteAs(o_.dtype, mine, i, InputValue(rank_, i));
  }

  uint64_t Verify(const Size& s) const {
    uint64_t wrong = 0;
    switch (o_.op) {
      case CollectiveOp::kAllReduce:
      case CollectiveOp::kAllReduceCoalesced:
        for (size_t i = 0; i < s.per_rank; ++i) {
          const double got = ReadAs(o_.dtype, static_cast<const std::byte*>(in_->data()), i);
          if (!Close(o_.dtype, got, Expected(o_.redop, o_.dtype, o_.ranks, i))) ++wrong;
        }
        break;
      case CollectiveOp::kAllGather:
        for (int p = 0; p < o_.ranks; ++p) {
          for (size_t i = 0; i < s.per_rank; ++i) {
            const double got =
                ReadAs(o_.dtype, static_cast<const std::byte*>(out_->data()), p * s.per_rank + i);
            if (got != AsStored(o_.dtype, InputValue(p, i))) ++wrong;
          }
        }
        break;
      case CollectiveOp::kReduceScatter:
        for (size_t i = 0; i < s.per_rank; ++i) {
          const size_t g = static_cast<size_t>(rank_) * s.per_rank + i;
          const double got = ReadAs(o_.dtype, static_cast<const std::byte*>(out_->data()), i);
          if (!Close(o_.dtype, got, Expected(o_.redop, o_.dtype, o_.ranks, g))) ++wrong;
        }
        break;
      case CollectiveOp::kBroadcast:  // rank 0's input everywhere
        for (size_t i = 0; i < s.per_rank; ++i) {
          if (ReadAs(o_.dtype, static_cast<const std::byte*>(in_->data()), i) !=
              AsStored(o_.dtype, InputValue(0, i)))
            ++wrong;
        }
        break;
      case CollectiveOp::kAllToAll:  // chunk p: rank p's chunk `rank_`
        for (int p = 0; p < o_.ranks; ++p) {
          for (size_t i = 0; i < s.per_rank; ++i) {
            const double got =
                ReadAs(o_.dtype, static_cast<const std::byte*>(out_->data()), p * s.per_rank + i);
            if (got != AsStored(o_.dtype, InputValue(p, rank_ * s.per_rank + i))) ++wrong;
          }
        }
        break;
      default:  // barrier: no data
        break;
    }
    return wrong;
  }

  // "oneshot" / "twoshot" for all-reduce on `path`; "auto" when a daemon of its own config
  // chose.
  const char* AlgoName(const Size& s) const { return AlgoName(o_.path, s); }
  const char* AlgoName(Path path, const Size& s) const {
    if (o_.op != CollectiveOp::kAllReduce && o_.op != CollectiveOp::kAllReduceCoalesced) return "-";
    if (path == Path::kSdk && !o_.runtime_dir.empty()) return "auto";
    const size_t ts = DataTypeSize(o_.dtype);
    const size_t min_count =
        o_.op == CollectiveOp::kAllReduce ? s.per_rank : s.per_rank / o_.tensors;
    return AllReduceAlgorithm(o_, s.per_rank * ts, min_count) == kernels::Algorithm::kOneShot
               ? "oneshot"
               : "twoshot";
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
    double factor = static_cast<double>(n - 1) / n;  // all-gather, reduce-scatter
    if (o_.op == CollectiveOp::kAllReduce || o_.op == CollectiveOp::kAllReduceCoalesced)
      factor *= 2;
    if (o_.op == CollectiveOp::kBroadcast) factor = 1;
    const bool bw = o_.op != CollectiveOp::kBarrier;
    const char* type = bw ? DataTypeName(o_.dtype) : "-";
    const char* redop = Reduces(o_.op) ? ReduceOpName(o_.redop) : "-";
    shared_->wrong += wrong;
    const std::string wrong_text = o_.check && bw ? absl::StrCat(wrong) : "N/A";
    const double busbw = bw ? algbw * factor : 0.0;
    // Percentage of the machine's limit (ceiling.h), "-" where none was measured.
    char ceiling[32] = "-", percent[32] = "-";
    if (s.ceiling_busbw > 0) {
      std::snprintf(ceiling, sizeof(ceiling), "%.3f", s.ceiling_busbw);
      std::snprintf(percent, sizeof(percent), "%.1f", 100 * busbw / s.ceiling_busbw);
    }
    if (o_.csv) {
      std::printf("%s,%s,%d,%zu,%zu,%s,%s,%s,%.3f,%.4f,%.4f,%s,%s,%s\n", OpName(o_.op),
                  PathName(o_.path), n, s.bytes, s.count, type, redop, AlgoName(s), us,
                  bw ? algbw : 0.0, busbw, wrong_text.c_str(), ceiling, percent);
    } else {
      std::printf("%12zu %12zu %9s %6s %8s %11.2f %8.3f %8.3f %7s %8s %6s\n", s.bytes, s.count,
                  type, redop, AlgoName(s), us, bw ? algbw : 0.0, busbw, wrong_text.c_str(),
                  ceiling, percent);
    }
    std::fflush(stdout);
  }

  // The median of `v` (the mean of the middle two for an even count).
  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }

  void PrintInterleavedRow(const Size& s, const std::vector<double>& sdk,
                           const std::vector<double>& kernel, const std::vector<double>& ratio) {
    uint64_t wrong = 0;
    for (int r = 0; r < o_.ranks; ++r) wrong += shared_->row.wrong[r];
    shared_->wrong += wrong;
    const bool bw = o_.op != CollectiveOp::kBarrier;
    const char* type = bw ? DataTypeName(o_.dtype) : "-";
    const char* redop = Reduces(o_.op) ? ReduceOpName(o_.redop) : "-";
    const std::string wrong_text = o_.check && bw ? absl::StrCat(wrong) : "N/A";
    const double sdk_us = Median(sdk) * 1e6, kernel_us = Median(kernel) * 1e6;
    const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
    if (o_.csv) {
      std::printf("%s,%d,%zu,%zu,%s,%s,%s,%s,%d,%.3f,%.3f,%.4f,%.4f,%.4f,%s\n", OpName(o_.op),
                  o_.ranks, s.bytes, s.count, type, redop, AlgoName(Path::kSdk, s),
                  AlgoName(Path::kKernel, s), o_.rounds, sdk_us, kernel_us, Median(ratio), *lo, *hi,
                  wrong_text.c_str());
    } else {
      std::printf("%12zu %12zu %9s %6s %8s %8s %6d %11.3f %11.3f %7.3f %7.3f %7.3f %7s\n", s.bytes,
                  s.count, type, redop, AlgoName(Path::kSdk, s), AlgoName(Path::kKernel, s),
                  o_.rounds, sdk_us, kernel_us, Median(ratio), *lo, *hi, wrong_text.c_str());
    }
    std::fflush(stdout);
  }

  const Options& o_;
  int rank_;
  Shared* shared_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Group> group_;
  std::unique_ptr<SymmetricBuffer> in_;
  std::unique_ptr<SymmetricBuffer> out_;
  std::unique_ptr<CollectivePath> path_;         // o_.path's (--path sdk,kernel: the SDK's)
  std::unique_ptr<CollectivePath> kernel_path_;  // --path sdk,kernel only
};

}  // namespace

void Fail(Shared* shared, const std::string& message) {
  if (shared->failed.exchange(1) == 0) {
    std::snprintf(shared->error, sizeof(shared->error), "%s", message.c_str());
  }
  ::_exit(1);
}

void RunRank(const Options& o, int rank, Shared* shared, const std::string& runtime_dir,
             const std::string& group_name, const std::vector<Size>& sizes) {
  Rank(o, rank, shared).Run(runtime_dir, group_name, sizes);
  std::fflush(stdout);
  ::_exit(0);
}

void PrintHeader(const Options& o) {
  if (o.interleaved && o.csv) {
    std::printf(
        "op,ranks,size,count,type,redop,algo_sdk,algo_kernel,rounds,sdk_us,kernel_us,ratio,"
        "ratio_lo,ratio_hi,wrong\n");
  } else if (o.interleaved) {
    std::printf("%12s %12s %9s %6s %8s %8s %6s %11s %11s %7s %7s %7s %7s\n", "size(B)", "count",
                "type", "redop", "algo", "algo", "rounds", "sdk(us)", "kernel(us)", "ratio", "lo",
                "hi", "#wrong");
    std::printf("%12s %12s %9s %6s %8s %8s %6s %11s %11s %7s %7s %7s %7s\n", "", "(elements)", "",
                "", "(sdk)", "(kernel)", "", "(median)", "(median)", "(median)", "", "", "");
  } else if (o.csv) {
    std::printf(
        "op,path,ranks,size,count,type,redop,algo,time_us,algbw_gbps,busbw_gbps,wrong,"
        "ceiling_busbw_gbps,pct_ceiling\n");
  } else {
    std::printf("%12s %12s %9s %6s %8s %11s %8s %8s %7s %8s %6s\n", "size(B)", "count", "type",
                "redop", "algo", "time(us)", "algbw", "busbw", "#wrong", "ceiling", "%ceil");
    std::printf("%12s %12s %9s %6s %8s %11s %8s %8s %7s %8s %6s\n", "", "(elements)", "", "", "",
                "", "(GB/s)", "(GB/s)", "", "(GB/s)", "");
  }
}

}  // namespace commd::bench
