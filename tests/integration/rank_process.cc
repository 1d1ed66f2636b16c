// One rank of a test job: connects to the daemon at $COMMD_RUNTIME_DIR, joins a group,
// allocates symmetric buffers, writes a rank-specific pattern into its own buffer, waits for
// every peer's "written" flag in their signal pads, and checks every peer's pattern through
// peer(r). Prints "OK ..." and exits 0, or "ERROR <status>" and exits 1.
//
//   rank_process GROUP RANK WORLD SIZES [MODE]
//     SIZES  comma-separated bytes per allocation, e.g. 4096,1048576
//     MODE   run (default) | hang-after-join (join, then sleep until killed)
//            | hang-before-join (connect, then sleep until killed)
//            | record:N (record N all-reduces in the flight recorder, print "RECORDED N",
//              then sleep until killed) | record-forever (print "RECORDING", record until
//              killed) | allreduce:N (print "RUNNING", run N int32 sum all-reduces through
//              Group::AllReduce on a symmetric host buffer checking each result, print
//              "ALLREDUCED N", then sleep until killed)
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "commd/commd.h"

namespace {

uint64_t Pattern(int rank, size_t i) { return (uint64_t{0x9e3779b97f4a7c15} * (i + 1)) ^ rank; }

int Fail(const absl::Status& status) {
  std::printf("ERROR %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

// Flags the pattern as written in this rank's pad, then waits for every peer's flag.
absl::Status ExchangeFlags(commd::SymmetricBuffer& buf, int rank, int world, uint32_t value) {
  std::atomic_ref<uint32_t>(buf.signal_pad(rank)[0]).store(value, std::memory_order_release);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int r = 0; r < world; ++r) {
    std::atomic_ref<uint32_t> flag(buf.signal_pad(r)[0]);
    // At least `value`: a fast peer may already have moved on to its next flag.
    while (flag.load(std::memory_order_acquire) < value) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("peer flag never set");
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(commd::SymmetricBuffer& buf, int rank, int world, uint32_t round) {
  const size_t words = buf.size() / sizeof(uint64_t);
  auto* mine = static_cast<uint64_t*>(buf.data());
  for (size_t i = 0; i < words; ++i) mine[i] = Pattern(rank, i) + round;
  if (auto s = ExchangeFlags(buf, rank, world, round); !s.ok()) return s;
  for (int r = 0; r < world; ++r) {
    const auto* theirs = static_cast<const uint64_t*>(buf.peer(r));
    for (size_t i = 0; i < words; ++i) {
      if (theirs[i] != Pattern(r, i) + round) {
        return absl::DataLossError("rank " + std::to_string(r) + " word " + std::to_string(i) +
                                   " does not hold its pattern");
      }
    }
  }
  // Nobody leaves (and stops mapping) before everyone has read.
  return ExchangeFlags(buf, rank, world, round + 1000);
}

// Records all-reduces of a 1024 x 1024 bf16 tensor, as a trainer recording NCCL calls would.
int Record(commd::Group& group, const std::string& mode) {
  commd::Recorder& rec = group.recorder();
  const int64_t dims[] = {1024, 1024};
  const commd::TensorDesc t{dims, 2, commd::DataType::kBFloat16};
  auto one = [&] {
    const commd::RecordId id = rec.Begin(commd::CollectiveOp::kAllReduce, {&t, 1}, {&t, 1});
    rec.Started(id);
    rec.Completed(id);
  };
  if (mode == "record-forever") {
    std::printf("RECORDING\n");
    std::fflush(stdout);
    for (uint64_t i = 0;; ++i) {
      one();
      if (i % 64 == 0) absl::SleepFor(absl::Microseconds(50));
    }
  }
  int n = 0;
  if (!absl::SimpleAtoi(mode.substr(mode.find(':') + 1), &n)) return 2;
  for (int i = 0; i < n; ++i) one();
  std::printf("RECORDED %d\n", n);
  std::fflush(stdout);
  for (;;) ::pause();
}

// N real all-reduces; the flight recorder gets one entry per call from the SDK itself.
int AllReduceMany(commd::Group& group, const std::string& mode) {
  int n = 0;
  if (!absl::SimpleAtoi(mode.substr(mode.find(':') + 1), &n)) return 2;
  constexpr size_t kCount = 16;
  auto buf = group.AllocateSymmetric(kCount * sizeof(int32_t));
  if (!buf.ok()) return Fail(buf.status());
  auto* v = static_cast<int32_t*>((*buf)->data());
  const int rank = group.rank(), world = group.world_size();
  std::printf("RUNNING\n");
  std::fflush(stdout);
  for (int i = 0; i < n; ++i) {
    for (size_t k = 0; k < kCount; ++k) v[k] = rank * 1000 + static_cast<int32_t>(k) + i;
    absl::Status s = group.AllReduce(**buf, kCount, commd::DataType::kInt32, commd::ReduceOp::kSum);
    if (!s.ok()) return Fail(s);
    for (size_t k = 0; k < kCount; ++k) {
      const int32_t want = 1000 * world * (world - 1) / 2 + world * (static_cast<int32_t>(k) + i);
      if (v[k] != want) {
        return Fail(absl::DataLossError(
            absl::StrCat("all-reduce ", i, " element ", k, " is ", v[k], ", expected ", want)));
      }
    }
  }
  std::printf("ALLREDUCED %d\n", n);
  std::fflush(stdout);
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: rank_process GROUP RANK WORLD SIZES [MODE]\n");
    return 2;
  }
  const std::string mode = argc > 5 ? argv[5] : "run";
  commd::GroupOptions options;
  options.name = argv[1];
  if (!absl::SimpleAtoi(argv[2], &options.rank) ||
      !absl::SimpleAtoi(argv[3], &options.world_size)) {
    return 2;
  }
  options.timeout = absl::Seconds(60);
  if (const char* d = std::getenv("COMMD_TEST_GROUP_DESCRIPTION")) options.description = d;
  auto client = commd::Client::Connect();
  if (!client.ok()) return Fail(client.status());
  if (mode == "hang-before-join") {
    std::printf("CONNECTED\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) return Fail(group.status());
  std::printf("JOINED %d/%d\n", (*group)->rank(), (*group)->world_size());
  std::fflush(stdout);
  if (mode == "hang-after-join") {
    for (;;) ::pause();
  }
  if (mode.rfind("record", 0) == 0) return Record(**group, mode);
  if (mode.rfind("allreduce:", 0) == 0) return AllReduceMany(**group, mode);
  uint32_t round = 1;
  for (absl::string_view size : absl::StrSplit(argv[4], ',')) {
    size_t bytes = 0;
    if (!absl::SimpleAtoi(size, &bytes)) return 2;
    auto buf = (*group)->AllocateSymmetric(bytes);
    if (!buf.ok()) return Fail(buf.status());
    if (auto s = CheckBuffer(**buf, options.rank, options.world_size, round++); !s.ok()) {
      return Fail(s);
    }
  }
  std::printf("OK rank %d verified %d peers\n", options.rank, options.world_size);
  return 0;
}
