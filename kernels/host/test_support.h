// Test support for the CPU collectives: symmetric host memory laid out as the daemon lays it
// out (one memfd per rank: [signal pad | padding to 128 B | data]), one real process per rank,
// deterministic never-zero inputs and a float64 reference computed independently of the
// kernels' element functions.
//
//   auto mem = SymmetricHostMemory::Create(4, 1 << 20).value();
//   auto outcomes = RunRanks(4, [&](int rank) -> absl::StatusOr<std::string> {
//     ASSIGN_OR_RETURN(auto mapped, MappedView::Map(mem, rank, nullptr, deadline));
//     ...
//     return std::string("digest");
//   });
//   ExpectAllOk(outcomes);
#ifndef COMMD_KERNELS_HOST_TEST_SUPPORT_H_
#define COMMD_KERNELS_HOST_TEST_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shm_mapping.h"
#include "common/unique_fd.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd::kernels::testing {

uint64_t SplitMix64(uint64_t x);

// The run's base seed: $COMMD_KERNELS_TEST_SEED if set, else random; printed on first use so
// a failure can be replayed.
uint64_t RunSeed();

// One memfd per rank, zero-filled, sized as the daemon sizes a symmetric allocation.
class SymmetricHostMemory {
 public:
  static absl::StatusOr<SymmetricHostMemory> Create(int world_size, size_t data_bytes);
  int world_size() const { return static_cast<int>(fds_.size()); }
  size_t data_bytes() const { return data_bytes_; }
  size_t allocation_bytes() const;
  int fd(int rank) const { return fds_[rank].get(); }

 private:
  std::vector<UniqueFd> fds_;
  size_t data_bytes_ = 0;
};

// A shared word that RunRanks clears before forking and a rank process sets when its body
// fails, so its peers' waits end with ABORTED instead of running into their deadlines.
uint32_t* FailureAbortWord();

// This process's own mapping of every rank's allocation (addresses differ per process, as
// in the SDK) and the HostCommView over it. A null `abort_word` means FailureAbortWord().
class MappedView {
 public:
  static absl::StatusOr<std::unique_ptr<MappedView>> Map(const SymmetricHostMemory& mem, int rank,
                                                         const uint32_t* abort_word,
                                                         absl::Time deadline);
  HostCommView& view() { return view_; }
  std::byte* own_data() { return data_[view_.rank]; }

 private:
  std::vector<SharedMapping> maps_;
  std::vector<std::byte*> data_;
  std::vector<uint32_t*> pads_;
  HostCommView view_;
};

// A page of MAP_SHARED memory created before the fork, so every rank process sees it at the
// same address (abort words, timestamps).
class SharedPage {
 public:
  static absl::StatusOr<SharedPage> Create(size_t bytes = 4096);
  template <typename T>
  T* at(size_t offset) {
    return reinterpret_cast<T*>(static_cast<std::byte*>(map_.data()) + offset);
  }

 private:
  SharedMapping map_;
};

struct RankOutcome {
  int rank = -1;
  bool ok = false;
  std::string report;  // the body's string when ok, else the failure
  double cpu_seconds = 0;
};

// Forks one process per rank and runs body(rank) in each: an OK value is the rank's report
// (exit 0), an error its failure (exit 1). Reaps every child; kills those still running
// after `timeout` (reported as failures).
std::vector<RankOutcome> RunRanks(int world_size,
                                  const std::function<absl::StatusOr<std::string>(int rank)>& body,
                                  absl::Duration timeout = absl::Seconds(150));

// Adds a gtest failure per failed rank.
void ExpectAllOk(const std::vector<RankOutcome>& outcomes);

// Input element `index` of `rank` for a run seeded `seed`: never zero, exactly representable
// in `type` (floats: magnitude in [0.1, 10); int32: up to 1e6; int64: up to 2^40).
double InputValue(DataType type, uint64_t seed, int rank, size_t index);
// Writes InputValue(type, seed, rank, first + i) for i in [0, count) to dst.
void FillInputs(DataType type, uint64_t seed, int rank, size_t first, size_t count, std::byte* dst);
// Element i of an array of `type`, as a double (fp16/bf16 decoded by the test's own code).
double LoadAsDouble(DataType type, const std::byte* base, size_t i);

// Checks out[i] against the reduction of every rank's InputValue(first + i), for i in
// [0, count): integers exactly, fp32 within world_size * 2^-24 * sum|x|, fp16/bf16 within
// that plus their own rounding of the result. The first mismatch is the error.
absl::Status CheckReduced(DataType type, ReduceOp op, uint64_t seed, int world_size,
                          const std::byte* out, size_t first, size_t count,
                          const std::string& what);
// Checks out[i] == InputValue(rank, first + i) exactly.
absl::Status CheckCopied(DataType type, uint64_t seed, int rank, const std::byte* out, size_t first,
                         size_t count, const std::string& what);

// Fills with the poison byte / checks that every byte still is it.
inline constexpr std::byte kPoison{0xA5};
void Poison(std::byte* p, size_t bytes);
absl::Status CheckPoisoned(const std::byte* p, size_t bytes, const std::string& what);

// FNV-1a over bytes, chained through `h`.
uint64_t Digest(const std::byte* p, size_t bytes, uint64_t h = 1469598103934665603ull);

}  // namespace commd::kernels::testing

#endif  // COMMD_KERNELS_HOST_TEST_SUPPORT_H_
