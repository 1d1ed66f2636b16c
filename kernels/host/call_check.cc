#include "kernels/host/call_check.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/signal_layout.h"

namespace commd::kernels {
namespace {

constexpr uint64_t kHashSeed = 0x9E3779B97F4A7C15ull;  // fixed: ranks in different processes agree
constexpr uint64_t kMixMultiplier = 0xFF51AFD7ED558CCDull;  // odd, from MurmurHash3's finaliser
constexpr uint32_t kNanBit = 1;
constexpr size_t kMaxDescribedCalls = 8;  // distinct calls named in a mismatch error

// One 64-bit word per step (a multiply and a shift, where byte-wise FNV took eight multiplies
// per word): with an odd multiplier each step is a bijection of h for a fixed v and of v for
// a fixed h, so two calls that differ in one word always differ in the 64-bit state.
uint64_t Mix(uint64_t h, uint64_t v) {
  h = (h ^ v) * kMixMultiplier;
  return h ^ (h >> 32);
}

uint32_t Saturate32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(v); }

// A shape word taken apart.
struct Shape {
  CollectiveOp kind;
  ReduceOp op;
  Algorithm algorithm;
  DataType dtype;
  uint32_t tensors;
  int root;  // broadcast; 0 otherwise
};

Shape Decode(uint32_t shape) {
  Shape s{static_cast<CollectiveOp>(shape & 0xF),
          static_cast<ReduceOp>((shape >> 4) & 0xF),
          static_cast<Algorithm>((shape >> 8) & 0xF),
          static_cast<DataType>((shape >> 12) & 0xF),
          shape >> 16,
          0};
  if (s.kind == CollectiveOp::kBroadcast) {
    s.root = static_cast<int>(s.tensors);
    s.tensors = 1;
  }
  return s;
}

// "100 x float32 (sum, one-shot (every rank reads all peers' inputs))", "3 tensors, the first
// 100 x float32 (sum)", "100 x int32 (root 3)", with the collective's name in front when it
// is not `kind`.
std::string DescribeCall(CollectiveOp kind, uint32_t count, const Shape& s) {
  std::string out;
  if (s.kind != kind) absl::StrAppend(&out, CollectiveName(s.kind), " of ");
  if (s.tensors != 1) absl::StrAppend(&out, s.tensors, " tensors, the first ");
  absl::StrAppend(&out, count == UINT32_MAX ? ">= 4294967295" : absl::StrCat(count), " x ",
                  DataTypeName(s.dtype));
  if (s.kind == CollectiveOp::kAllReduce) {
    absl::StrAppend(&out, " (", ReduceOpName(s.op), ", ", AlgorithmWords(s.algorithm), ")");
  } else if (s.kind == CollectiveOp::kReduceScatter) {
    absl::StrAppend(&out, " (", ReduceOpName(s.op), ")");
  } else if (s.kind == CollectiveOp::kBroadcast) {
    absl::StrAppend(&out, " (root ", s.root, ")");
  }
  return out;
}

// Cold path: names every distinct call and the ranks that made it.
absl::Status MismatchError(const HostExchange& x, CollectiveOp kind,
                           const std::vector<uint32_t>& hashes) {
  const HostCommView& view = x.view();
  std::vector<uint32_t> distinct;
  for (uint32_t h : hashes) {
    if (std::find(distinct.begin(), distinct.end(), h) == distinct.end()) distinct.push_back(h);
  }
  std::vector<std::string> parts;
  std::vector<std::string> descriptions;
  for (size_t i = 0; i < distinct.size() && i < kMaxDescribedCalls; ++i) {
    std::vector<int> ranks;
    for (int p = 0; p < view.world_size; ++p) {
      if (hashes[p] == distinct[i]) ranks.push_back(p);
    }
    const CallWords words = x.words(ranks[0]);
    const Shape shape = Decode(words.shape);
    std::string d = DescribeCall(kind, words.count, shape);
    // Calls that differ only in later tensors or in where the inputs sit in the data regions
    // look alike: tell them apart by their hash, and say what else differs.
    const bool alike = std::find(descriptions.begin(), descriptions.end(), d) != descriptions.end();
    if (alike || shape.tensors > 1) {
      absl::StrAppend(&d, " [call hash 0x", absl::Hex(distinct[i]),
                      alike ? ": a later tensor or the data-region offsets differ]" : "]");
    }
    descriptions.push_back(d);
    parts.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "),
                                 ranks.size() == 1 ? " has " : " have ", d));
  }
  if (distinct.size() > kMaxDescribedCalls) {
    parts.push_back(absl::StrCat(distinct.size() - kMaxDescribedCalls, " more distinct calls"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(CollectiveName(kind), " on rank ", view.rank, ": ranks disagree on the call: ",
                   absl::StrJoin(parts, "; "), "; allowed: the same call on every rank"));
}

}  // namespace

CallWords MakeCallWords(const CallSignature& call, uint64_t nonfinite) {
  const absl::Span<const TensorArgs> tensors = call.tensors;
  // The enums and the root (< kMaxWorldSize) are small and non-negative: one word for them.
  uint64_t h =
      Mix(kHashSeed, static_cast<uint64_t>(call.kind) | static_cast<uint64_t>(call.op) << 16 |
                         static_cast<uint64_t>(call.algorithm) << 32 |
                         static_cast<uint64_t>(call.root) << 48);
  h = Mix(h, tensors.size());
  h = Mix(h, call.staging);
  for (const TensorArgs& t : tensors) {
    h = Mix(h, t.count);
    h = Mix(h, static_cast<uint64_t>(t.dtype));
  }
  h *= kMixMultiplier;  // spread the last words into the top bits before folding to 31
  const uint32_t h31 = static_cast<uint32_t>(h >> 33);
  CallWords w;
  w.call = h31 << 1;
  w.count = tensors.empty() ? 0 : Saturate32(tensors[0].count);
  const uint32_t dtype = tensors.empty() ? 0 : static_cast<uint32_t>(tensors[0].dtype) & 0xF;
  // A broadcast has one tensor: the top half names its root instead.
  const uint32_t high = call.kind == CollectiveOp::kBroadcast
                            ? static_cast<uint32_t>(call.root)
                            : std::min<uint32_t>(Saturate32(tensors.size()), 0xFFFF);
  w.shape = (static_cast<uint32_t>(call.kind) & 0xF) | (static_cast<uint32_t>(call.op) & 0xF) << 4 |
            (static_cast<uint32_t>(call.algorithm) & 0xF) << 8 | dtype << 12 |
            (high & 0xFFFF) << 16;
  return AddNonfinite(w, nonfinite);
}

CallWords AddNonfinite(CallWords words, uint64_t nonfinite) {
  words.call = (words.call & ~kNanBit) | (nonfinite > 0 ? kNanBit : 0);
  words.nan_count = Saturate32(nonfinite);
  return words;
}

absl::Status CheckCalls(const HostExchange& x, CollectiveOp kind, CollectiveResult* result) {
  // The hot path: one word per rank, from this rank's own memory.
  const int w = x.view().world_size;
  const uint32_t first = x.words(0).call >> 1;
  uint32_t differ = 0;
  uint32_t nan = 0;
  for (int p = 0; p < w; ++p) {
    const uint32_t call = x.words(p).call;
    differ |= (call >> 1) ^ first;
    nan |= call & kNanBit;
  }
  if (differ != 0) {
    std::vector<uint32_t> hashes(w);
    for (int p = 0; p < w; ++p) hashes[p] = x.words(p).call >> 1;
    return MismatchError(x, kind, hashes);
  }
  if (result == nullptr || nan == 0) return absl::OkStatus();
  for (int p = 0; p < w; ++p) {
    const CallWords words = x.words(p);
    if ((words.call & kNanBit) == 0) continue;
    if (result->nonfinite_ranks++ == 0) result->first_nonfinite_rank = p;
    result->group_nonfinite_count += words.nan_count;
  }
  return absl::OkStatus();
}

}  // namespace commd::kernels
