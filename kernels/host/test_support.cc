#include "kernels/host/test_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/symmetric_layout.h"
#include "gtest/gtest.h"
#include "kernels/float16.h"
#include "kernels/signal_layout.h"

namespace commd::kernels::testing {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t RunSeed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    if (const char* env = std::getenv("COMMD_KERNELS_TEST_SEED"); env != nullptr && *env) {
      s = std::strtoull(env, nullptr, 0);
    } else {
      s = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    std::printf(
        "kernels test seed: %" PRIu64 " (replay with COMMD_KERNELS_TEST_SEED=%" PRIu64 ")\n", s, s);
    std::fflush(stdout);
    return s;
  }();
  return seed;
}

absl::StatusOr<SymmetricHostMemory> SymmetricHostMemory::Create(int world_size, size_t data_bytes) {
  SymmetricHostMemory mem;
  mem.data_bytes_ = data_bytes;
  const size_t bytes = SymmetricDataOffset(world_size) + data_bytes;
  for (int r = 0; r < world_size; ++r) {
    const std::string name = absl::StrCat("commd-kernels-test-", r);
    SYS_ASSIGN_OR_RETURN(const int fd, memfd_create(name.c_str(), MFD_CLOEXEC));
    mem.fds_.emplace_back(fd);
    SYS_RETURN_IF_ERROR(ftruncate(fd, static_cast<off_t>(bytes)));
  }
  return mem;
}

size_t SymmetricHostMemory::allocation_bytes() const {
  return SymmetricDataOffset(world_size()) + data_bytes_;
}

absl::StatusOr<std::unique_ptr<MappedView>> MappedView::Map(const SymmetricHostMemory& mem,
                                                            int rank, const uint32_t* abort_word,
                                                            absl::Time deadline) {
  auto m = std::unique_ptr<MappedView>(new MappedView);
  const int w = mem.world_size();
  for (int p = 0; p < w; ++p) {
    ASSIGN_OR_RETURN(SharedMapping map, SharedMapping::Map(mem.fd(p), mem.allocation_bytes()));
    auto* base = static_cast<std::byte*>(map.data());
    m->pads_.push_back(reinterpret_cast<uint32_t*>(base));
    m->data_.push_back(base + SymmetricDataOffset(w));
    m->maps_.push_back(std::move(map));
  }
  m->view_ = HostCommView{.rank = rank,
                          .world_size = w,
                          .data = m->data_.data(),
                          .pads = m->pads_.data(),
                          .data_bytes = mem.data_bytes(),
                          .pad_slots = SignalPadBytes(w) / sizeof(uint32_t),
                          .abort_word = abort_word ? abort_word : FailureAbortWord(),
                          .deadline = deadline};
  return m;
}

absl::StatusOr<SharedPage> SharedPage::Create(size_t bytes) {
  SYS_ASSIGN_OR_RETURN(const int raw, memfd_create("commd-kernels-test-page", MFD_CLOEXEC));
  UniqueFd fd(raw);
  SYS_RETURN_IF_ERROR(ftruncate(fd.get(), static_cast<off_t>(bytes)));
  SharedPage page;
  ASSIGN_OR_RETURN(page.map_, SharedMapping::Map(fd.get(), bytes));
  return page;
}

uint32_t* FailureAbortWord() {
  static uint32_t* word = [] {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint32_t*>(p);
  }();
  return word;
}

namespace {

[[noreturn]] void RunChild(int rank, int fd,
                           const std::function<absl::StatusOr<std::string>(int)>& body) {
  absl::StatusOr<std::string> result = body(rank);
  if (!result.ok() && FailureAbortWord() != nullptr) {
    __atomic_store_n(FailureAbortWord(), 1u, __ATOMIC_RELEASE);  // peers stop waiting for us
  }
  std::string msg = result.ok() ? *result : result.status().ToString();
  if (msg.size() > 16000) msg.resize(16000);  // stays below the pipe's buffer
  size_t done = 0;
  while (done < msg.size()) {
    const ssize_t n = write(fd, msg.data() + done, msg.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  _exit(result.ok() ? 0 : 1);
}

// Reads every pipe until EOF or the deadline; returns false on timeout.
bool DrainPipes(std::vector<int>& fds, std::vector<std::string>& out, absl::Time deadline) {
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<size_t> index;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] >= 0) {
        pfds.push_back(pollfd{fds[i], POLLIN, 0});
        index.push_back(i);
      }
    }
    if (pfds.empty()) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    if (poll(pfds.data(), pfds.size(), ms) < 0 && errno != EINTR) return false;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(pfds[k].fd, buf, sizeof buf);
      if (n > 0) {
        out[index[k]].append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(pfds[k].fd);
        fds[index[k]] = -1;
      }
    }
  }
}

}  // namespace

std::vector<RankOutcome> RunRanks(int world_size,
                                  const std::function<absl::StatusOr<std::string>(int)>& body,
                                  absl::Duration timeout) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<RankOutcome> outcomes(world_size);
  std::vector<pid_t> pids(world_size, -1);
  std::vector<int> fds(world_size, -1);
  if (FailureAbortWord() != nullptr) __atomic_store_n(FailureAbortWord(), 0u, __ATOMIC_RELEASE);
  for (int r = 0; r < world_size; ++r) {
    outcomes[r].rank = r;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      outcomes[r].report = absl::StrCat("pipe2: ", std::strerror(errno));
      continue;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      RunChild(r, p[1], body);
    }
    close(p[1]);
    if (pid < 0) {
      close(p[0]);
      outcomes[r].report = absl::StrCat("fork: ", std::strerror(errno));
      continue;
    }
    pids[r] = pid;
    fds[r] = p[0];
  }
  std::vector<std::string> reports(world_size);
  const bool drained = DrainPipes(fds, reports, absl::Now() + timeout);
  for (int r = 0; r < world_size; ++r) {
    if (fds[r] >= 0) close(fds[r]);
    if (pids[r] < 0) continue;
    if (!drained) kill(pids[r], SIGKILL);
    int status = 0;
    rusage usage{};
    while (wait4(pids[r], &status, 0, &usage) < 0 && errno == EINTR) {
    }
    RankOutcome& o = outcomes[r];
    o.cpu_seconds = usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
                    (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
    o.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    o.report = reports[r];
    if (!drained && !o.ok)
      o.report += absl::StrCat(" [killed after ", absl::FormatDuration(timeout), "]");
    if (WIFSIGNALED(status)) o.report += absl::StrCat(" [signal ", WTERMSIG(status), "]");
  }
  return outcomes;
}

void ExpectAllOk(const std::vector<RankOutcome>& outcomes) {
  for (const RankOutcome& o : outcomes) {
    EXPECT_TRUE(o.ok) << "rank " << o.rank << ": " << o.report;
  }
}

namespace {

uint64_t InputBits(uint64_t seed, int rank, size_t index) {
  return SplitMix64(seed ^ SplitMix64((static_cast<uint64_t>(rank) << 48) ^ index));
}

// The test's own decoders, independent of kernels/float16.h.
double DecodeHalf(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}
double DecodeBFloat16(uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int exp = (b >> 7) & 0xff;
  const int mant = b & 0x7f;
  if (exp == 0xff) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -133);
  return sign * std::ldexp(128 + mant, exp - 134);
}

// Encodes a random value of magnitude in [2^-4, 2^4) directly as bits.
uint16_t RandomHalfBits(uint64_t bits) {
  const uint16_t exp = static_cast<uint16_t>(11 + (bits >> 20) % 8);  // 2^-4 .. 2^3
  return static_cast<uint16_t>(((bits >> 40) & 1) << 15 | exp << 10 | (bits & 0x3ff));
}
uint16_t RandomBFloat16Bits(uint64_t bits) {
  const uint16_t exp = static_cast<uint16_t>(123 + (bits >> 20) % 8);
  return static_cast<uint16_t>(((bits >> 40) & 1) << 15 | exp << 7 | (bits & 0x7f));
}

}  // namespace

double InputValue(DataType type, uint64_t seed, int rank, size_t index) {
  const uint64_t bits = InputBits(seed, rank, index);
  const double sign = (bits >> 63) ? -1.0 : 1.0;
  switch (type) {
    case DataType::kFloat32: {
      const double unit = static_cast<double>(bits >> 11 & ((1ull << 40) - 1)) / (1ull << 40);
      return sign * static_cast<double>(static_cast<float>(0.1 + 9.9 * unit));
    }
    case DataType::kFloat64: {
      const double unit = static_cast<double>(bits >> 11 & ((1ull << 52) - 1)) / (1ull << 52);
      return sign * (0.1 + 9.9 * unit);
    }
    case DataType::kFloat16:
      return DecodeHalf(RandomHalfBits(bits));
    case DataType::kBFloat16:
      return DecodeBFloat16(RandomBFloat16Bits(bits));
    case DataType::kInt32:
      return sign * static_cast<double>(1 + (bits >> 8) % 1000000);
    case DataType::kInt64:
      return sign * static_cast<double>(1 + (bits >> 8) % (1ull << 40));
    // The narrow integers over their whole range, so sums wrap (the reference wraps too).
    case DataType::kInt8:
      return static_cast<int8_t>(bits >> 8);
    case DataType::kUInt8:
      return static_cast<uint8_t>(bits >> 8);
    case DataType::kInt16:
      return static_cast<int16_t>(bits >> 8);
    case DataType::kBool:
      return (bits >> 8) & 1;
    default:
      return 0;
  }
}

void FillInputs(DataType type, uint64_t seed, int rank, size_t first, size_t count,
                std::byte* dst) {
  for (size_t i = 0; i < count; ++i) {
    const size_t index = first + i;
    const uint64_t bits = InputBits(seed, rank, index);
    switch (type) {
      case DataType::kFloat32: {
        const float v = static_cast<float>(InputValue(type, seed, rank, index));
        std::memcpy(dst + 4 * i, &v, 4);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = RandomHalfBits(bits);
        std::memcpy(dst + 2 * i, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t b = RandomBFloat16Bits(bits);
        std::memcpy(dst + 2 * i, &b, 2);
        break;
      }
      case DataType::kFloat64: {
        const double v = InputValue(type, seed, rank, index);
        std::memcpy(dst + 8 * i, &v, 8);
        break;
      }
      case DataType::kInt32: {
        const int32_t v = static_cast<int32_t>(InputValue(type, seed, rank, index));
        std::memcpy(dst + 4 * i, &v, 4);
        break;
      }
      case DataType::kInt64: {
        const int64_t v = static_cast<int64_t>(InputValue(type, seed, rank, index));
        std::memcpy(dst + 8 * i, &v, 8);
        break;
      }
      case DataType::kInt8:
      case DataType::kUInt8:
        dst[i] = static_cast<std::byte>(bits >> 8);
        break;
      case DataType::kInt16: {
        const uint16_t v = static_cast<uint16_t>(bits >> 8);
        std::memcpy(dst + 2 * i, &v, 2);
        break;
      }
      case DataType::kBool:  // true as any nonzero byte, which the kernels must read as true
        dst[i] = static_cast<std::byte>(
            InputValue(type, seed, rank, index) != 0 ? 1 + (bits >> 16) % 255 : 0);
        break;
      default:
        break;
    }
  }
}

double LoadAsDouble(DataType type, const std::byte* base, size_t i) {
  switch (type) {
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return DecodeHalf(h);
    }
    case DataType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, base + 2 * i, 2);
      return DecodeBFloat16(b);
    }
    case DataType::kFloat64: {
      double v;
      std::memcpy(&v, base + 8 * i, 8);
      return v;
    }
    case DataType::kInt32: {
      int32_t v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DataType::kInt64: {
      int64_t v;
      std::memcpy(&v, base + 8 * i, 8);
      return static_cast<double>(v);
    }
    case DataType::kInt8:
      return static_cast<int8_t>(base[i]);
    case DataType::kUInt8:
      return static_cast<uint8_t>(base[i]);
    case DataType::kInt16: {
      int16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return v;
    }
    case DataType::kBool:
      return base[i] != std::byte{0} ? 1 : 0;
    default:
      return NAN;
  }
}

namespace {

// An integer result as the type stores it: its low bits (bool: nonzero is 1).
double Wrap(DataType type, int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  switch (type) {
    case DataType::kInt8:
      return static_cast<int8_t>(static_cast<uint8_t>(u));
    case DataType::kUInt8:
      return static_cast<uint8_t>(u);
    case DataType::kInt16:
      return static_cast<int16_t>(static_cast<uint16_t>(u));
    case DataType::kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(u));
    case DataType::kBool:
      return v != 0 ? 1 : 0;
    default:
      return static_cast<double>(v);
  }
}

struct Reference {
  double value;
  double sum_abs;
};

// The product as the kernels take it: integers in wrapping int64, floats in their accumulator
// (float for fp32, fp16 and bf16; double for fp64) in rank order, rounded once to the type,
// so fp16 overflows to Inf and underflows to 0 as the kernels' results do.
double ProductAt(DataType type, uint64_t seed, int world_size, size_t k) {
  if (!IsFloatingPoint(type)) {
    uint64_t p = 1;
    for (int r = 0; r < world_size; ++r) {
      p *= static_cast<uint64_t>(static_cast<int64_t>(InputValue(type, seed, r, k)));
    }
    return Wrap(type, static_cast<int64_t>(p));
  }
  if (type == DataType::kFloat64) {
    double p = 1;
    for (int r = 0; r < world_size; ++r) p *= InputValue(type, seed, r, k);
    return p;
  }
  float p = 1;
  for (int r = 0; r < world_size; ++r) p *= static_cast<float>(InputValue(type, seed, r, k));
  if (type == DataType::kFloat16) return DecodeHalf(FloatToHalf(p).bits);
  if (type == DataType::kBFloat16) return DecodeBFloat16(FloatToBFloat16(p).bits);
  return p;
}

// band, bor, bxor of the integers' two's complement bits (bool's 0 and 1).
double BitwiseAt(DataType type, ReduceOp op, uint64_t seed, int world_size, size_t k) {
  int64_t acc = static_cast<int64_t>(InputValue(type, seed, 0, k));
  for (int r = 1; r < world_size; ++r) {
    const int64_t x = static_cast<int64_t>(InputValue(type, seed, r, k));
    acc = op == ReduceOp::kBAnd ? acc & x : op == ReduceOp::kBOr ? acc | x : acc ^ x;
  }
  return Wrap(type, acc);
}

Reference ReferenceAt(DataType type, ReduceOp op, uint64_t seed, int world_size, size_t k) {
  const bool integer = !IsFloatingPoint(type);
  int64_t isum = 0;
  double sum = 0, sum_abs = 0, lo = INFINITY, hi = -INFINITY;
  for (int p = 0; p < world_size; ++p) {
    const double x = InputValue(type, seed, p, k);
    sum += x;
    sum_abs += std::fabs(x);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    isum += static_cast<int64_t>(x);
  }
  switch (op) {
    case ReduceOp::kSum:
      return {integer ? Wrap(type, isum) : sum, sum_abs};
    case ReduceOp::kAvg:
      return {integer ? Wrap(type, isum / world_size) : sum / world_size, sum_abs};
    case ReduceOp::kMin:
      return {lo, sum_abs};
    case ReduceOp::kMax:
      return {hi, sum_abs};
    case ReduceOp::kProduct:
      return {ProductAt(type, seed, world_size, k), 0};
    case ReduceOp::kBAnd:
    case ReduceOp::kBOr:
    case ReduceOp::kBXor:
      return {BitwiseAt(type, op, seed, world_size, k), 0};
  }
  return {NAN, 0};
}

double Tolerance(DataType type, ReduceOp op, int world_size, const Reference& ref) {
  if (!IsFloatingPoint(type) || op == ReduceOp::kMin || op == ReduceOp::kMax) return 0;
  // The unit roundoff of the accumulator: fp64's for float64, fp32's for the others.
  const double u = std::ldexp(1.0, type == DataType::kFloat64 ? -53 : -24);
  // ProductAt multiplies as the kernels do; the bound allows an ulp of the type besides.
  if (op == ReduceOp::kProduct) {
    const double type_u = type == DataType::kFloat16    ? std::ldexp(1.0, -10)
                          : type == DataType::kBFloat16 ? std::ldexp(1.0, -7)
                                                        : u;
    return (world_size * u + type_u) * std::fabs(ref.value) +
           (type == DataType::kFloat16 ? std::ldexp(1.0, -24) : 0);
  }
  // Order-dependent sum of world_size terms, then (avg) one division.
  double err = world_size * u * ref.sum_abs;
  if (op == ReduceOp::kAvg) err = err / world_size + u * std::fabs(ref.value);
  if (type == DataType::kFloat16) {
    err += std::ldexp(1.0, -11) * (std::fabs(ref.value) + err) + std::ldexp(1.0, -25);
  } else if (type == DataType::kBFloat16) {
    err += std::ldexp(1.0, -8) * (std::fabs(ref.value) + err) + std::ldexp(1.0, -133);
  }
  return err;
}

}  // namespace

absl::Status CheckReduced(DataType type, ReduceOp op, uint64_t seed, int world_size,
                          const std::byte* out, size_t first, size_t count,
                          const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const Reference ref = ReferenceAt(type, op, seed, world_size, first + i);
    const double got = LoadAsDouble(type, out, i);
    const double tol = Tolerance(type, op, world_size, ref);
    if (!(got == ref.value || std::fabs(got - ref.value) <= tol)) {  // ==: Inf
      return absl::InternalError(absl::StrCat(
          what, ": element ", first + i, " (", DataTypeName(type), " ", ReduceOpName(op),
          ", world ", world_size, ") is ", got, ", expected ", ref.value, " +- ", tol));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCopied(DataType type, uint64_t seed, int rank, const std::byte* out, size_t first,
                         size_t count, const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const double want = InputValue(type, seed, rank, first + i);
    const double got = LoadAsDouble(type, out, i);
    if (got != want) {
      return absl::InternalError(absl::StrCat(what, ": element ", first + i, " from rank ", rank,
                                              " is ", got, ", expected ", want));
    }
  }
  return absl::OkStatus();
}

void Poison(std::byte* p, size_t bytes) { std::memset(p, static_cast<int>(kPoison), bytes); }

absl::Status CheckPoisoned(const std::byte* p, size_t bytes, const std::string& what) {
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != kPoison) {
      return absl::InternalError(absl::StrCat(what, ": byte ", i, " was written"));
    }
  }
  return absl::OkStatus();
}

uint64_t Digest(const std::byte* p, size_t bytes, uint64_t h) {
  for (size_t i = 0; i < bytes; ++i) {
    h ^= static_cast<uint64_t>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace commd::kernels::testing
