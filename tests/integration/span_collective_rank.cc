// One rank of a group that spans nodes, running collectives across the nodes and checking
// their results against what every global rank contributed.
//
//   span_collective_rank GROUP RANK WORLD GLOBAL_RANK GLOBAL_WORLD TIMEOUT_MS LEAVE_FILE MODE
//
// Connects to $COMMD_RUNTIME_DIR (job $COMMD_JOB_ID), joins, prints "joined", runs MODE:
//   matrix    every collective (barrier, all-reduce with every op, coalesced all-reduce,
//             broadcast from the first and last global rank, all-gather, reduce-scatter with
//             every op, all-to-all) on every type, counts 1, 3, 1000 and 40000, and all-reduces
//             of 1048577 (lanes for 4-byte and 8-byte types), on symmetric buffers and the
//             host-memory overloads; prints "matrix OK <calls>" or
//             "matrix FAIL <what>" at the first wrong element or failed call
//   mismatch  one all-reduce of 8 floats, 9 on the last global rank: "mismatch <CODE> <msg>";
//             one of 8 floats, 1048577 on global rank 2: "paths <CODE> <msg>"; then a
//             barrier: "after <CODE> <msg>"
//   nan       the group checks every input and fails on NaN/Inf; global rank 1 holds a NaN:
//             "nan <CODE> <msg>", then a clean all-reduce: "clean <CODE> <msg>"
//   hang      one all-reduce on every rank (the nodes' leaders connect); then the ranks on
//             node index 1 stop calling, the others all-reduce again and print
//             "hang <CODE> <ms> <msg>" (ms: how long the call took)
//   hang-first  the same without the first all-reduce (the leader waits to connect)
//   late      the ranks on node index 1 wait for LEAVE_FILE.go; then every rank all-reduces 8
//             floats of (global rank + 1) and prints "late <CODE> <first element> <msg>"
//   skip      5 all-reduces of 8 floats, 4 on the last global rank (it skips one, and the
//             others wait in the fifth); prints "ran <n>" before the last one it makes
//   bench     all-reduce of float32 at 8 B .. 64 MiB through the host-memory overloads; the
//             first global rank prints "bench <bytes> <iterations> <median us>" per size
// Then waits for LEAVE_FILE and exits 0 (1 when a call the mode needs failed).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/typed_elements.h"

namespace {

using commd::DataType;
using commd::ReduceOp;
using commd::testing::Load;
using commd::testing::Narrow;
using commd::testing::Size;
using commd::testing::Store;

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string Said(absl::string_view what, const absl::Status& s) {
  return absl::StrCat(what, " ", absl::StatusCodeToString(s.code()), " ", s.message());
}

// Global rank g's element i: small integers, exact in every type, and distinct per rank.
double Value(int g, size_t i) { return static_cast<double>((g + 1) * static_cast<int>(i % 7 + 1)); }

// The reduction over every global rank of Value(g, i), as type t rounds or truncates it.
// Products and bits of integers as the type keeps them: in 64-bit two's complement, narrowed.
double Reduced(DataType t, ReduceOp op, int world, size_t i) {
  double sum = 0, lo = Value(0, i), hi = Value(0, i), product = 1;
  uint64_t iproduct = 1, bits = 0;
  for (int g = 0; g < world; ++g) {
    sum += Value(g, i);
    lo = std::min(lo, Value(g, i));
    hi = std::max(hi, Value(g, i));
    product *= Value(g, i);
    iproduct *= static_cast<uint64_t>(Value(g, i));
    bits ^= static_cast<uint64_t>(Value(g, i));
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kAvg: {
      return commd::IsFloatingPoint(t) ? sum / world : std::trunc(sum / world);
    }
    case ReduceOp::kMin:
      return lo;
    case ReduceOp::kMax:
      return hi;
    case ReduceOp::kProduct:
      return commd::IsFloatingPoint(t) ? product : Narrow(t, iproduct);
    case ReduceOp::kBXor:
      return Narrow(t, bits);
    default:  // not run here (band and bor share bxor's path)
      return 0;
  }
}

bool Close(DataType t, double got, double want) {
  const double tol = t == DataType::kBFloat16 ? 1e-2 : t == DataType::kFloat16 ? 1e-3 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

class Matrix {
 public:
  Matrix(commd::Group& group, commd::SymmetricBuffer& a, commd::SymmetricBuffer& b)
      : group_(group), a_(a), b_(b), world_(group.global_world_size()), me_(group.global_rank()) {}

  // "" when every check passed, else the first failure.
  std::string Run() {
    if (auto s = group_.Barrier(); !s.ok()) return Said("barrier", s);
    ++calls_;
    // uint8 and int16 take gloo's 1- and 2-byte paths; sums of up to 8 ranks stay in range.
    const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                              DataType::kInt32,   DataType::kInt64,   DataType::kUInt8,
                              DataType::kInt16};
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};
    for (DataType t : types) {
      for (size_t count : {size_t{1}, size_t{3}, size_t{1000}, size_t{40000}}) {
        for (bool host : {false, true}) {
          for (ReduceOp op : ops) {
            if (std::string e = AllReduce(t, count, op, host); !e.empty()) return e;
            if (std::string e = ReduceScatter(t, count, op, host); !e.empty()) return e;
          }
          // Product (float32's stays exact enough; fp16's would overflow) and bxor across
          // nodes, at one odd size: they take the same gloo path as the ops above.
          if (count == 1000 && host) {
            for (ReduceOp op : {ReduceOp::kProduct, ReduceOp::kBXor}) {
              if (commd::IsFloatingPoint(t) && (op == ReduceOp::kBXor || t != DataType::kFloat32)) {
                continue;
              }
              if (std::string e = AllReduce(t, count, op, host); !e.empty()) return e;
            }
          }
          for (int root : {0, world_ - 1}) {
            if (std::string e = Broadcast(t, count, root, host); !e.empty()) return e;
          }
          if (std::string e = AllGather(t, count, host); !e.empty()) return e;
          if (std::string e = AllToAll(t, count, host); !e.empty()) return e;
        }
      }
    }
    // Large all-reduces: on nodes of equal size they run in lanes (one per local rank).
    for (DataType t : types) {
      for (bool host : {false, true}) {
        for (ReduceOp op : ops) {
          if (std::string e = AllReduce(t, kLarge, op, host); !e.empty()) return e;
        }
      }
    }
    if (std::string e = Coalesced(); !e.empty()) return e;
    return "";
  }
  int calls() const { return calls_; }
  static constexpr size_t kLarge = 1048577;  // 4 MiB of float32 and more; odd: slices differ

 private:
  std::string Where(const char* what, DataType t, size_t count, bool host, size_t i, double got,
                    double want) {
    return absl::StrCat(what, " type ", static_cast<int>(t), " count ", count,
                        host ? " host" : " symmetric", ": element ", i, " is ", got, ", want ",
                        want);
  }
  std::string Failed(const char* what, DataType t, size_t count, const absl::Status& s) {
    return absl::StrCat(what, " type ", static_cast<int>(t), " count ", count, ": ", s.ToString());
  }
  std::vector<std::byte>& Host(std::vector<std::byte>& v, size_t bytes) {
    v.assign(bytes, std::byte{0});
    return v;
  }

  std::string AllReduce(DataType t, size_t count, ReduceOp op, bool host) {
    ++calls_;
    void* data = a_.data();
    if (host) data = Host(in_, count * Size(t)).data();
    for (size_t i = 0; i < count; ++i) Store(data, i, t, Value(me_, i));
    const absl::Status s =
        host ? group_.AllReduce(data, data, count, t, op, a_) : group_.AllReduce(a_, count, t, op);
    if (!s.ok()) return Failed("all-reduce", t, count, s);
    for (size_t i = 0; i < count; ++i) {
      const double want = Reduced(t, op, world_, i), got = Load(data, i, t);
      if (!Close(t, got, want)) return Where("all-reduce", t, count, host, i, got, want);
    }
    return "";
  }

  std::string ReduceScatter(DataType t, size_t count, ReduceOp op, bool host) {
    ++calls_;
    const size_t n = count * static_cast<size_t>(world_);
    void* in = host ? Host(in_, n * Size(t)).data() : a_.data();
    void* out = host ? Host(out_, count * Size(t)).data() : b_.data();
    for (size_t i = 0; i < n; ++i) Store(in, i, t, Value(me_, i));
    const absl::Status s = host ? group_.ReduceScatter(in, out, count, t, op, a_)
                                : group_.ReduceScatter(a_, b_, count, t, op);
    if (!s.ok()) return Failed("reduce-scatter", t, count, s);
    for (size_t i = 0; i < count; ++i) {
      const size_t at = static_cast<size_t>(me_) * count + i;
      const double want = Reduced(t, op, world_, at), got = Load(out, i, t);
      if (!Close(t, got, want)) return Where("reduce-scatter", t, count, host, i, got, want);
    }
    if (!host) {  // the input is left as it was
      for (size_t i = 0; i < n; ++i) {
        if (Load(in, i, t) != Value(me_, i)) {
          return Where("reduce-scatter input", t, count, host, i, Load(in, i, t), Value(me_, i));
        }
      }
    }
    return "";
  }

  std::string Broadcast(DataType t, size_t count, int root, bool host) {
    ++calls_;
    void* data = host ? Host(in_, count * Size(t)).data() : a_.data();
    for (size_t i = 0; i < count; ++i) Store(data, i, t, me_ == root ? Value(root, i) : -1);
    const absl::Status s =
        host ? group_.Broadcast(data, count, t, root, a_) : group_.Broadcast(a_, count, t, root);
    if (!s.ok()) return Failed("broadcast", t, count, s);
    for (size_t i = 0; i < count; ++i) {
      if (!Close(t, Load(data, i, t), Value(root, i))) {
        return Where("broadcast", t, count, host, i, Load(data, i, t), Value(root, i));
      }
    }
    return "";
  }

  std::string AllGather(DataType t, size_t count, bool host) {
    ++calls_;
    const size_t n = count * static_cast<size_t>(world_);
    void* in = host ? Host(in_, count * Size(t)).data() : a_.data();
    void* out = host ? Host(out_, n * Size(t)).data() : b_.data();
    for (size_t i = 0; i < count; ++i) Store(in, i, t, Value(me_, i));
    const absl::Status s =
        host ? group_.AllGather(in, out, count, t, a_) : group_.AllGather(a_, b_, count, t);
    if (!s.ok()) return Failed("all-gather", t, count, s);
    for (size_t i = 0; i < n; ++i) {
      const double want = Value(static_cast<int>(i / count), i % count);
      if (!Close(t, Load(out, i, t), want)) {
        return Where("all-gather", t, count, host, i, Load(out, i, t), want);
      }
    }
    return "";
  }

  std::string AllToAll(DataType t, size_t count, bool host) {
    ++calls_;
    const size_t n = count * static_cast<size_t>(world_);
    void* in = host ? Host(in_, n * Size(t)).data() : a_.data();
    void* out = host ? Host(out_, n * Size(t)).data() : b_.data();
    for (size_t i = 0; i < n; ++i) Store(in, i, t, Value(me_, i));
    const absl::Status s =
        host ? group_.AllToAll(in, out, count, t, a_) : group_.AllToAll(a_, b_, count, t);
    if (!s.ok()) return Failed("all-to-all", t, count, s);
    for (size_t i = 0; i < n; ++i) {
      // Block p came from rank p: its block for this rank.
      const size_t p = i / count, at = static_cast<size_t>(me_) * count + i % count;
      const double want = Value(static_cast<int>(p), at);
      if (!Close(t, Load(out, i, t), want)) {
        return Where("all-to-all", t, count, host, i, Load(out, i, t), want);
      }
    }
    return "";
  }

  std::string Coalesced() {
    ++calls_;
    const std::vector<commd::CoalescedTensor> tensors = {
        {.offset = 0, .count = 5, .dtype = DataType::kFloat32},
        {.offset = 64, .count = 3, .dtype = DataType::kInt64},
        {.offset = 128, .count = 0, .dtype = DataType::kBFloat16},
        {.offset = 192, .count = 9, .dtype = DataType::kBFloat16}};
    auto* base = static_cast<std::byte*>(a_.data());
    for (const auto& t : tensors) {
      for (size_t i = 0; i < t.count; ++i) Store(base + t.offset, i, t.dtype, Value(me_, i));
    }
    if (auto s = group_.AllReduceCoalesced(a_, tensors, ReduceOp::kMax); !s.ok()) {
      return Said("coalesced", s);
    }
    for (const auto& t : tensors) {
      for (size_t i = 0; i < t.count; ++i) {
        const double want = Reduced(t.dtype, ReduceOp::kMax, world_, i);
        if (!Close(t.dtype, Load(base + t.offset, i, t.dtype), want)) {
          return Where("coalesced", t.dtype, t.count, false, i, Load(base + t.offset, i, t.dtype),
                       want);
        }
      }
    }
    return "";
  }

  commd::Group& group_;
  commd::SymmetricBuffer& a_;
  commd::SymmetricBuffer& b_;
  const int world_;
  const int me_;
  int calls_ = 0;
  std::vector<std::byte> in_, out_;
};

}  // namespace

int main(int argc, char** argv) {
  int rank = 0, world = 0, global_rank = 0, global_world = 0;
  int64_t timeout_ms = 0;
  if (argc != 9 || !absl::SimpleAtoi(argv[2], &rank) || !absl::SimpleAtoi(argv[3], &world) ||
      !absl::SimpleAtoi(argv[4], &global_rank) || !absl::SimpleAtoi(argv[5], &global_world) ||
      !absl::SimpleAtoi(argv[6], &timeout_ms)) {
    std::fprintf(stderr,
                 "usage: span_collective_rank GROUP RANK WORLD GLOBAL_RANK GLOBAL_WORLD "
                 "TIMEOUT_MS LEAVE_FILE MODE\n");
    return 2;
  }
  const std::string mode = argv[8];
  const char* job = std::getenv("COMMD_JOB_ID");
  auto client = commd::Client::Connect({.job_id = job == nullptr ? "job" : job});
  if (!client.ok()) {
    Print(Said("connect", client.status()));
    return 1;
  }
  commd::GroupOptions options{.name = argv[1],
                              .rank = rank,
                              .world_size = world,
                              .global_rank = global_rank,
                              .global_world_size = global_world,
                              .timeout = absl::Milliseconds(timeout_ms)};
  if (mode == "nan") {
    options.nan_check = commd::GroupOptions::NanCheck::kOn;
    options.nan_policy = commd::GroupOptions::NanPolicy::kFail;
  }
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) {
    Print(Said("join", group.status()));
    return 1;
  }
  commd::Group& g = **group;
  Print("joined");
  // Room for 40000 x 8 bytes x global world size (all-gather's output, reduce-scatter's input).
  const size_t bytes =
      mode == "bench"
          ? (64u << 20)
          : std::max<size_t>(40000u * 8u * static_cast<size_t>(global_world), Matrix::kLarge * 8);
  auto a = g.AllocateSymmetric(bytes);
  auto b = g.AllocateSymmetric(bytes);
  if (!a.ok() || !b.ok()) {
    Print(Said("allocate", a.ok() ? b.status() : a.status()));
    return 1;
  }
  int rc = 0;
  if (mode == "matrix") {
    Matrix m(g, **a, **b);
    const std::string failure = m.Run();
    Print(failure.empty() ? absl::StrCat("matrix OK ", m.calls()) : "matrix FAIL " + failure);
    rc = failure.empty() ? 0 : 1;
  } else if (mode == "mismatch") {
    // The last rank's count is one more; then global rank 2's so large that its node would
    // run in lanes where the others' would ride with the agreement.
    const size_t count = global_rank == global_world - 1 ? 9 : 8;
    Print(Said("mismatch", g.AllReduce(**a, count, DataType::kFloat32, ReduceOp::kSum)));
    const size_t paths = global_rank == 2 ? Matrix::kLarge : 8;
    Print(Said("paths", g.AllReduce(**a, paths, DataType::kFloat32, ReduceOp::kSum)));
    Print(Said("after", g.Barrier()));
  } else if (mode == "nan") {
    auto* f = static_cast<float*>((*a)->data());
    for (int i = 0; i < 8; ++i) f[i] = global_rank == 1 && i == 3 ? NAN : 1.0f;
    Print(Said("nan", g.AllReduce(**a, 8, DataType::kFloat32, ReduceOp::kSum)));
    for (int i = 0; i < 8; ++i) f[i] = 1.0f;
    Print(Said("clean", g.AllReduce(**a, 8, DataType::kFloat32, ReduceOp::kSum)));
  } else if (mode == "hang" || mode == "hang-first") {
    if (mode == "hang") {
      Print(Said("first", g.AllReduce(**a, 8, DataType::kFloat32, ReduceOp::kSum)));
    }
    if (g.node_index() != 1) {
      const absl::Time start = absl::Now();
      const absl::Status s = g.AllReduce(**a, 8, DataType::kFloat32, ReduceOp::kSum);
      Print(absl::StrCat("hang ", absl::StatusCodeToString(s.code()), " ",
                         absl::ToInt64Milliseconds(absl::Now() - start), " ", s.message()));
    }
  } else if (mode == "late") {
    if (g.node_index() == 1) {
      while (::access(absl::StrCat(argv[7], ".go").c_str(), F_OK) != 0) {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
    auto* f = static_cast<float*>((*a)->data());
    for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(global_rank + 1);
    const absl::Status s = g.AllReduce(**a, 8, DataType::kFloat32, ReduceOp::kSum);
    Print(absl::StrCat("late ", absl::StatusCodeToString(s.code()), " ", f[0], " ", s.message()));
  } else if (mode == "skip") {
    const int calls = global_rank == global_world - 1 ? 4 : 5;
    for (int i = 0; i < calls; ++i) {
      if (i == calls - 1) Print(absl::StrCat("ran ", i));
      (void)g.AllReduce(**a, 8, DataType::kFloat32, ReduceOp::kSum);
    }
  } else if (mode == "bench") {
    std::vector<float> data((64u << 20) / sizeof(float), 1.0f);
    for (size_t size : {size_t{8}, size_t{64}, size_t{1} << 10, size_t{8} << 10, size_t{64} << 10,
                        size_t{1} << 20, size_t{8} << 20, size_t{64} << 20}) {
      const size_t count = size / sizeof(float);
      const int iterations = size <= (64u << 10) ? 200 : size <= (4u << 20) ? 20 : 5;
      std::vector<double> us;
      for (int it = 0; it < iterations + 2; ++it) {
        const absl::Time start = absl::Now();
        const absl::Status s =
            g.AllReduce(data.data(), data.data(), count, DataType::kFloat32, ReduceOp::kSum, **a);
        if (!s.ok()) {
          Print(Said("bench", s));
          return 1;
        }
        if (it >= 2) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      }
      std::sort(us.begin(), us.end());
      if (global_rank == 0)
        Print(absl::StrCat("bench ", size, " ", iterations, " ", us[us.size() / 2]));
    }
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  while (::access(argv[7], F_OK) != 0) absl::SleepFor(absl::Milliseconds(50));
  return rc;
}
