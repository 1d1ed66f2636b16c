// collective_rank's fused-matmul modes: Group::AllGatherMatmul and MatmulReduceScatter against
// the unfused float64 reference (all-gather then matmul; matmul then reduce-scatter), every
// rank regenerating every rank's operands from the shared seed.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/collective_rank.h"

#ifdef COMMD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace collective_rank {
namespace {

// Operand values for (rank, tag, index): Input's, which are exact in every type.
struct Matrix {
  std::vector<uint64_t> storage;  // 8-byte aligned for every type
  void* data() { return storage.data(); }
};

Matrix Fill(const Run& run, int r, uint64_t tag, size_t n, DataType t) {
  Matrix m{std::vector<uint64_t>(n + 1, 0)};
  for (size_t i = 0; i < n; ++i) Store(m.data(), i, t, Input(run, r, tag, i, t));
  return m;
}

// The same values as doubles, for the reference (Input seeds a generator per value: slow).
std::vector<double> Values(const Run& run, int r, uint64_t tag, size_t n, DataType t) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Input(run, r, tag, i, t);
  return v;
}

// Scales that are exact in float: rows 1, 1.5, 2, ...; columns 0.5, 1, 0.5, ...
std::vector<float> RowScales(size_t first, size_t n) {
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = 1.0f + 0.5f * static_cast<float>((first + i) % 3);
  return s;
}
std::vector<float> ColScales(size_t n) {
  std::vector<float> s(n);
  for (size_t j = 0; j < n; ++j) s[j] = j % 2 == 0 ? 0.5f : 1.0f;
  return s;
}

// |got - want| within the output type's rounding of the magnitude the terms reach.
bool Close(double got, double want, double magnitude, DataType t) {
  const double rel = t == DataType::kFloat32 ? 1e-5 : t == DataType::kFloat16 ? 2e-3 : 1.6e-2;
  return std::fabs(got - want) <= rel * magnitude + 1e-6;
}

// Where a call's operands live: this process's memory on host groups; on CUDA runs
// (run.cuda_stream set) device copies made before the call, and the outputs copied back to
// the host vectors once the stream has finished. The checks then read host memory either way.
class Placement {
 public:
  explicit Placement(Run& run) : run_(run) {}
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;
  ~Placement() { Finish(); }

  bool on_device() const { return run_.cuda_stream != nullptr; }
  commd::CollectiveOptions options() const { return {.cuda_stream = run_.cuda_stream}; }
  // A copy of `bytes` at `host` the call reads.
  void* In(const void* host, size_t bytes) {
    if (!on_device()) return const_cast<void*>(host);
    void* dev = Allocate(bytes);
    Copy(dev, host, bytes, /*to_device=*/true);
    return dev;
  }
  // Where the call writes what Finish brings to `host`.
  void* Out(void* host, size_t bytes) {
    if (!on_device()) return host;
    void* dev = Allocate(bytes);
    outs_.push_back({host, dev, bytes});
    return dev;
  }
  // The shard, at the start of this rank's symmetric buffer.
  void Shard(const void* host, size_t bytes) {
    if (!on_device()) {
      std::memcpy(run_.in.data(), host, bytes);
    } else {
      Copy(run_.in.data(), host, bytes, /*to_device=*/true);
    }
  }
  // Waits for the stream; the outputs are on the host from here.
  void Finish() {
#ifdef COMMD_HAVE_CUDA
    if (!on_device() || done_) return;
    done_ = true;
    auto* stream = static_cast<cudaStream_t>(run_.cuda_stream);
    for (const OutCopy& o : outs_) {
      Cuda(cudaMemcpyAsync(o.host, o.dev, o.bytes, cudaMemcpyDeviceToHost, stream), "copy out");
    }
    Cuda(cudaStreamSynchronize(stream), "stream sync");
    for (void* p : allocated_) cudaFree(p);
#endif
  }

 private:
  struct OutCopy {
    void* host;
    void* dev;
    size_t bytes;
  };
#ifdef COMMD_HAVE_CUDA
  void Cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) run_.Fail(std::string(what) + ": " + cudaGetErrorString(e));
  }
  void* Allocate(size_t bytes) {
    void* p = nullptr;
    Cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    allocated_.push_back(p);
    return p;
  }
  void Copy(void* dst, const void* src, size_t bytes, bool) {
    Cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                         static_cast<cudaStream_t>(run_.cuda_stream)),
         "copy in");
  }
#else
  void* Allocate(size_t) { return nullptr; }
  void Copy(void*, const void*, size_t, bool) {}
#endif
  Run& run_;
  std::vector<OutCopy> outs_;
  std::vector<void*> allocated_;
  bool done_ = false;
};

const char* TypeName(DataType t) {
  return t == DataType::kFloat32 ? "float32" : t == DataType::kFloat16 ? "float16" : "bfloat16";
}

constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};

// rows x k shard per rank (3-D A: rows = a * b, its row scales following the flattened rows),
// two Bs (k x n1 and k x n2, this rank's own), optionally scaled and gathered.
void CheckAllGatherMatmul(Run& run, DataType t, size_t rows, size_t k, size_t n1, size_t n2,
                          bool scaled, bool gather) {
  const int world = run.args.world, rank = run.args.rank;
  const uint64_t tag_a = ++run.tag, tag_b = ++run.tag;
  const size_t es = Size(t), grows = rows * static_cast<size_t>(world);
  const std::string what =
      absl::StrCat("all_gather_matmul ", TypeName(t), " rows ", rows, " k ", k, " n ", n1, "/", n2,
                   scaled ? " scaled" : "", gather ? " gathered" : "");
  Placement at(run);
  at.Shard(Fill(run, rank, tag_a, rows * k, t).data(), rows * k * es);
  const size_t ns[2] = {n1, n2};
  Matrix b[2] = {Fill(run, rank, tag_b, k * n1, t), Fill(run, rank, tag_b + 1000, k * n2, t)};
  std::vector<uint64_t> out[2] = {std::vector<uint64_t>(grows * n1 * es / 8 + 1),
                                  std::vector<uint64_t>(grows * n2 * es / 8 + 1)};
  std::vector<uint64_t> gathered(grows * k * es / 8 + 1);
  const std::vector<float> row_scale = RowScales(static_cast<size_t>(rank) * rows, rows);
  const std::vector<float> col_scale[2] = {ColScales(n1), ColScales(n2)};
  std::vector<commd::MatmulB> bs;
  for (int j = 0; j < 2; ++j) {
    bs.push_back({.data = at.In(b[j].data(), k * ns[j] * es),
                  .n = ns[j],
                  .out = at.Out(out[j].data(), grows * ns[j] * es),
                  // B 1: row scales alone
                  .col_scale = scaled && j == 0 ? static_cast<const float*>(at.In(
                                                      col_scale[j].data(), ns[j] * sizeof(float)))
                                                : nullptr});
  }
  run.Check(what.c_str(),
            run.g.AllGatherMatmul(
                run.in, rows, k, t, bs,
                scaled ? static_cast<const float*>(at.In(row_scale.data(), rows * sizeof(float)))
                       : nullptr,
                gather ? at.Out(gathered.data(), grows * k * es) : nullptr, at.options()));
  at.Finish();
  std::vector<std::vector<double>> shards;
  for (int p = 0; p < world; ++p) shards.push_back(Values(run, p, tag_a, rows * k, t));
  for (int j = 0; j < 2; ++j) {
    const size_t n = ns[j];
    const std::vector<double> bj = Values(run, rank, j == 0 ? tag_b : tag_b + 1000, k * n, t);
    const std::vector<float> gr = RowScales(0, grows);
    int bad = 0;
    for (size_t i = 0; i < grows && bad < 3; ++i) {
      const int owner = static_cast<int>(i / rows);
      const size_t local = i % rows;
      for (size_t c = 0; c < n && bad < 3; ++c) {
        double want = 0, magnitude = 0;
        for (size_t x = 0; x < k; ++x) {
          const double term = shards[owner][local * k + x] * bj[x * n + c];
          want += term;
          magnitude += std::fabs(term);
        }
        const double scale = !scaled ? 1.0 : gr[i] * (j == 0 ? col_scale[j][c] : 1.0f);
        want *= scale;
        magnitude *= scale;
        const double got = Load(out[j].data(), i * n + c, t);
        if (!Close(got, want, magnitude, t)) {
          ++bad;
          run.Fail(
              absl::StrCat(what, ": B ", j, " out[", i, "][", c, "] = ", got, ", want ", want));
        }
      }
    }
  }
  if (!gather) return;
  for (size_t i = 0; i < grows * k; ++i) {
    const int owner = static_cast<int>(i / (rows * k));
    const double want = shards[owner][i % (rows * k)];
    if (Load(gathered.data(), i, t) != want) {
      run.Fail(absl::StrCat(what, ": gathered[", i, "] = ", Load(gathered.data(), i, t), ", want ",
                            want));
      return;
    }
  }
}

// Every rank's own A (rows x k) and B (k x n); this rank gets its rows / world rows of the
// sum (or mean) over ranks of the (scaled) products.
void CheckMatmulReduceScatter(Run& run, DataType t, size_t rows, size_t k, size_t n, ReduceOp op,
                              bool scaled) {
  const int world = run.args.world, rank = run.args.rank;
  const uint64_t tag_a = ++run.tag, tag_b = ++run.tag;
  const size_t chunk = rows / static_cast<size_t>(world);
  const std::string what =
      absl::StrCat("matmul_reduce_scatter ", TypeName(t), " rows ", rows, " k ", k, " n ", n,
                   op == ReduceOp::kAvg ? " avg" : " sum", scaled ? " scaled" : "");
  Matrix a = Fill(run, rank, tag_a, rows * k, t);
  Matrix b = Fill(run, rank, tag_b, k * n, t);
  std::vector<uint64_t> out(chunk * n * Size(t) / 8 + 1);
  const std::vector<float> row_scale = RowScales(0, rows), col_scale = ColScales(n);
  const size_t es = Size(t);
  Placement at(run);
  const commd::MatmulB mb{
      .data = at.In(b.data(), k * n * es),
      .n = n,
      .out = at.Out(out.data(), chunk * n * es),
      .col_scale =
          scaled ? static_cast<const float*>(at.In(col_scale.data(), n * sizeof(float))) : nullptr};
  run.Check(what.c_str(),
            run.g.MatmulReduceScatter(
                at.In(a.data(), rows * k * es), rows, k, t, mb, op, run.out,
                scaled ? static_cast<const float*>(at.In(row_scale.data(), rows * sizeof(float)))
                       : nullptr,
                at.options()));
  at.Finish();
  std::vector<std::vector<double>> as, bs;
  for (int r = 0; r < world; ++r) {
    as.push_back(Values(run, r, tag_a, rows * k, t));
    bs.push_back(Values(run, r, tag_b, k * n, t));
  }
  int bad = 0;
  for (size_t i = 0; i < chunk && bad < 3; ++i) {
    const size_t row = static_cast<size_t>(rank) * chunk + i;
    for (size_t c = 0; c < n && bad < 3; ++c) {
      double want = 0, magnitude = 0;
      for (int r = 0; r < world; ++r) {
        double dot = 0, mag = 0;
        for (size_t x = 0; x < k; ++x) {
          const double term = as[r][row * k + x] * bs[r][x * n + c];
          dot += term;
          mag += std::fabs(term);
        }
        const double s = scaled ? row_scale[row] * col_scale[c] : 1.0;
        want += dot * s;
        magnitude += mag * s;
      }
      if (op == ReduceOp::kAvg) want /= world, magnitude /= world;
      const double got = Load(out.data(), i * n + c, t);
      if (!Close(got, want, magnitude, t)) {
        ++bad;
        run.Fail(absl::StrCat(what, ": out[", i, "][", c, "] = ", got, ", want ", want));
      }
    }
  }
}

}  // namespace

// The same on CUDA groups (rank r on GpuOfRank(r)): operands in device memory, calls on a stream.
void CudaFusedMatmul(Run& run) {
#ifdef COMMD_HAVE_CUDA
  if (cudaSetDevice(GpuOfRank(run.args.rank)) != cudaSuccess) return run.Fail("cudaSetDevice");
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return run.Fail("cudaStreamCreate");
  run.cuda_stream = stream;
  FusedMatmul(run);
  run.cuda_stream = nullptr;
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
#else
  run.Fail("cuda_matmul needs a CUDA build");
#endif
}

void FusedMatmul(Run& run) {
  const size_t world = static_cast<size_t>(run.args.world);
  for (DataType t : kTypes) {
    CheckAllGatherMatmul(run, t, 5, 7, 9, 3, /*scaled=*/false, /*gather=*/false);
    CheckAllGatherMatmul(run, t, 1, 13, 1, 17, /*scaled=*/true, /*gather=*/true);
    // A of shape [2, 3, 11] per rank: rows 6, its [2, 3] row scales flattened with it.
    CheckAllGatherMatmul(run, t, 2 * 3, 11, 5, 8, /*scaled=*/true, /*gather=*/false);
    CheckMatmulReduceScatter(run, t, 3 * world, 7, 9, ReduceOp::kSum, /*scaled=*/false);
    CheckMatmulReduceScatter(run, t, world, 1, 13, ReduceOp::kAvg, /*scaled=*/true);
    CheckMatmulReduceScatter(run, t, 2 * 3 * world, 5, 4, ReduceOp::kSum, /*scaled=*/true);
  }
  // Larger than one conversion block of a 16-bit A (256 KiB of fp32 rows), and back to back.
  for (int i = 0; i < 3; ++i) {
    CheckAllGatherMatmul(run, DataType::kBFloat16, 64, 1100, 16, 5, true, false);
    CheckMatmulReduceScatter(run, DataType::kFloat16, 64 * world, 1100, 24, ReduceOp::kSum, true);
  }
}

// Bad calls: INVALID_ARGUMENT naming the value and the range, nothing entered (the next good
// call still matches the reference on every rank).
void FusedMatmulInvalid(Run& run) {
  const int world = run.args.world;
  std::vector<float> b(64 * 64, 1.0f), out(64 * 64 * 8);
  const commd::MatmulB mb{.data = b.data(), .n = 4, .out = out.data()};
  ExpectInvalid(run, "rows not divisible",
                run.g.MatmulReduceScatter(b.data(), 2 * world + 1, 4, DataType::kFloat32, mb,
                                          ReduceOp::kSum, run.out),
                "rows are not divisible by the world size");
  ExpectInvalid(run, "int32", run.g.AllGatherMatmul(run.in, 2, 4, DataType::kInt32, {mb}),
                "is not one of float32, float16, bfloat16");
  ExpectInvalid(run, "max op",
                run.g.MatmulReduceScatter(b.data(), world, 4, DataType::kFloat32, mb,
                                          ReduceOp::kMax, run.out),
                "is not one of sum (0), avg (1)");
  ExpectInvalid(run, "shard too big",
                run.g.AllGatherMatmul(run.in, run.in.size() / 4, 2, DataType::kFloat32, {mb}),
                "does not fit buffer");
  ExpectInvalid(run, "no B", run.g.AllGatherMatmul(run.in, 2, 4, DataType::kFloat32, {}),
                "0 Bs (allowed: 1 to 8)");
  commd::MatmulB null_out = mb;
  null_out.out = nullptr;
  ExpectInvalid(run, "null out",
                run.g.AllGatherMatmul(run.in, 2, 4, DataType::kFloat32, {null_out}),
                "B 0 needs non-null data and out");
  ExpectInvalid(
      run, "workspace too small",
      run.g.MatmulReduceScatter(b.data(), world, 4, DataType::kFloat32,
                                {.data = b.data(), .n = run.out.size(), .out = out.data()},
                                ReduceOp::kSum, run.out),
      "do not fit workspace");
  CheckAllGatherMatmul(run, DataType::kFloat32, 3, 5, 7, 2, true, false);
}

// Rank 1's shard holds a NaN and the group's policy is FAIL: DATA_LOSS on every rank.
void FusedMatmulNanFail(Run& run) {
  std::vector<float> b(4 * 3, 1.0f), out(3 * 8 * run.args.world);
  auto* a = static_cast<float*>(run.in.data());
  for (int i = 0; i < 8; ++i) a[i] = run.args.rank == 1 && i == 5 ? NAN : 1.0f;
  const absl::Status s = run.g.AllGatherMatmul(run.in, 2, 4, DataType::kFloat32,
                                               {{.data = b.data(), .n = 3, .out = out.data()}});
  if (!absl::IsDataLoss(s) || !absl::StrContains(s.message(), "the first rank 1")) {
    run.Fail("NaN in rank 1's shard under FAIL: want DATA_LOSS naming rank 1, got " + s.ToString());
  }
}

// The last rank never calls: the others give up after their timeout, naming it.
void FusedMatmulMissingRank(Run& run) {
  const int last = run.args.world - 1;
  if (run.args.rank == last) {
    // Alive but absent: an exited rank would end the group's session instead.
    absl::SleepFor(absl::Seconds(5));
    return;
  }
  std::vector<float> b(4 * 3, 1.0f), out(3 * 8 * run.args.world);
  const absl::Status s = run.g.AllGatherMatmul(run.in, 2, 4, DataType::kFloat32,
                                               {{.data = b.data(), .n = 3, .out = out.data()}},
                                               nullptr, nullptr, {.timeout = absl::Seconds(2)});
  const std::string names = absl::StrCat("ranks not arrived: [", last, "]");
  if (!absl::IsDeadlineExceeded(s) || !absl::StrContains(s.message(), names)) {
    run.Fail("a rank that never came: want DEADLINE_EXCEEDED with \"" + names + "\", got " +
             s.ToString());
  }
}

}  // namespace collective_rank
