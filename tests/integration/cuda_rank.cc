// One rank of a test job on a CUDA device, for tests that run the daemon's CUDA backend and the
// SDK's mapping on tests/fixtures/fake_libcuda (whose device memory is host memory, so this
// process reads and writes device pointers directly). Joins GROUP on cuda:0 of its own
// enumeration (CUDA_VISIBLE_DEVICES picks which GPU that is), then:
//   1. allocates a symmetric buffer of BYTES; its signal pad and data must read zero;
//   2. writes a rank pattern, exchanges flags, checks every peer's pattern through peer(r);
//   3. dirties its whole pad and data (0xab), releases the buffer, and checks that no
//      mapping or fd of device memory is left in this process;
//   4. allocates again (the driver may hand back the same physical memory): zero again;
//      writes its pattern there.
// Prints "OK" then waits until the file GO exists (the test looks at the daemon meanwhile, and
// may let peers leave first), checks that every peer's pattern is still there (memory a
// departed peer's rank held lives on while this rank maps it), exits 0; or prints
// "ERROR <status>" and exits 1.
//
//   cuda_rank GROUP RANK WORLD BYTES GO
//
// Or, for named persistent buffers on cuda:0 of its enumeration:
//   cuda_rank create NAME   AllocatePersistent NAME (4096 bytes), write a pattern, print "OK"
//   cuda_rank attach NAME   AttachPersistent NAME, check the pattern, print "OK"
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/fake_device_memory.h"

namespace {

int Fail(const absl::Status& status) {
  std::printf("ERROR %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

absl::Status ExpectZero(const void* p, size_t bytes, const std::string& what) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != 0) {
      return absl::DataLossError(absl::StrCat(what, " byte ", i, " of ", bytes, " is ",
                                              static_cast<int>(b[i]), ", not zero"));
    }
  }
  return absl::OkStatus();
}

absl::Status ExpectFresh(commd::SymmetricBuffer& buf, int rank, const std::string& when) {
  if (auto s = ExpectZero(buf.signal_pad(rank), buf.signal_pad_bytes(), when + " signal pad");
      !s.ok()) {
    return s;
  }
  return ExpectZero(buf.data(), buf.size(), when + " data");
}

// Sets this rank's pad slot `slot` (zero until then) and waits for every peer's. A peer past
// its last flag may already have dirtied its pad: any non-zero value counts.
absl::Status Flag(commd::SymmetricBuffer& buf, int world, int rank, int slot) {
  std::atomic_ref<uint32_t>(buf.signal_pad(rank)[slot]).store(1, std::memory_order_release);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int r = 0; r < world; ++r) {
    while (std::atomic_ref<uint32_t>(buf.signal_pad(r)[slot]).load(std::memory_order_acquire) ==
           0) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("peer flag never set");
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  return absl::OkStatus();
}

// Patterns differ between groups, so one group's data is never taken for another's.
unsigned char group_salt = 0;

unsigned char Pattern(int rank, size_t i) {
  return static_cast<unsigned char>(rank * 31 + i + group_salt);
}

void WritePattern(commd::SymmetricBuffer& buf, int rank) {
  auto* mine = static_cast<unsigned char*>(buf.data());
  for (size_t i = 0; i < buf.size(); ++i) mine[i] = Pattern(rank, i);
}

absl::Status CheckPatterns(commd::SymmetricBuffer& buf, int world, const std::string& what) {
  for (int r = 0; r < world; ++r) {
    const auto* theirs = static_cast<const unsigned char*>(buf.peer(r));
    for (size_t i = 0; i < buf.size(); ++i) {
      if (theirs[i] != Pattern(r, i)) {
        return absl::DataLossError(
            absl::StrCat("rank ", r, "'s byte ", i, " does not hold its pattern ", what));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExchangePatterns(commd::SymmetricBuffer& buf, int world, int rank) {
  WritePattern(buf, rank);
  if (auto s = Flag(buf, world, rank, 0); !s.ok()) return s;
  if (auto s = CheckPatterns(buf, world, "(not the same memory)"); !s.ok()) return s;
  return Flag(buf, world, rank, 1);  // nobody dirties its buffer before everyone has read
}

// The second buffer, held until GO so the test sees where the daemon placed it.
absl::StatusOr<std::unique_ptr<commd::SymmetricBuffer>> Run(commd::Group& group, size_t bytes) {
  const int rank = group.rank(), world = group.world_size();
  {
    auto buf = group.AllocateSymmetric(bytes);
    if (!buf.ok()) return buf.status();
    if (auto s = ExpectFresh(**buf, rank, "new"); !s.ok()) return s;
    if (auto s = ExchangePatterns(**buf, world, rank); !s.ok()) return s;
    std::memset((*buf)->signal_pad(rank), 0xab, (*buf)->signal_pad_bytes());
    std::memset((*buf)->data(), 0xab, (*buf)->size());
  }
  if (auto held = commd::testing::FakeDeviceMemoryOf(::getpid()); held.fds + held.mappings != 0) {
    return absl::InternalError(absl::StrCat(held.fds, " fds and ", held.mappings,
                                            " mappings of device memory left after the release"));
  }
  auto again = group.AllocateSymmetric(bytes);
  if (!again.ok()) return again.status();
  if (auto s = ExpectFresh(**again, rank, "recycled"); !s.ok()) return s;
  WritePattern(**again, rank);
  return again;
}

constexpr size_t kPersistentBytes = 4096;

int Persistent(const std::string& mode, const std::string& name) {
  auto client = commd::Client::Connect({});
  if (!client.ok()) return Fail(client.status());
  if (mode == "create") {
    auto buf = (*client)->AllocatePersistent(name, kPersistentBytes, absl::Seconds(60),
                                             commd::Device::Cuda(0));
    if (!buf.ok()) return Fail(buf.status());
    auto* p = static_cast<unsigned char*>((*buf)->data());
    for (size_t i = 0; i < kPersistentBytes; ++i) p[i] = Pattern(7, i);
  } else {
    auto buf = (*client)->AttachPersistent(name);
    if (!buf.ok()) return Fail(buf.status());
    const auto* p = static_cast<const unsigned char*>((*buf)->data());
    for (size_t i = 0; i < kPersistentBytes; ++i) {
      if (p[i] != Pattern(7, i)) return Fail(absl::DataLossError("not the creator's pattern"));
    }
  }
  std::printf("OK\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3) return Persistent(argv[1], argv[2]);
  if (argc != 6) {
    std::fprintf(stderr, "usage: cuda_rank GROUP RANK WORLD BYTES GO\n");
    return 2;
  }
  commd::GroupOptions options;
  options.name = argv[1];
  size_t bytes = 0;
  if (!absl::SimpleAtoi(argv[2], &options.rank) ||
      !absl::SimpleAtoi(argv[3], &options.world_size) || !absl::SimpleAtoi(argv[4], &bytes)) {
    return 2;
  }
  group_salt = static_cast<unsigned char>(std::hash<std::string>()(options.name));
  options.device = commd::Device::Cuda(0);
  options.timeout = absl::Seconds(60);
  auto client = commd::Client::Connect({});
  if (!client.ok()) return Fail(client.status());
  auto group = (*client)->JoinGroup(options);
  if (!group.ok()) return Fail(group.status());
  auto held = Run(**group, bytes);
  if (!held.ok()) return Fail(held.status());
  std::printf("OK\n");
  std::fflush(stdout);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!std::filesystem::exists(argv[5])) {
    if (absl::Now() > deadline) return Fail(absl::DeadlineExceededError("GO never appeared"));
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (auto s = CheckPatterns(**held, options.world_size, "at the end"); !s.ok()) return Fail(s);
  return 0;
}
