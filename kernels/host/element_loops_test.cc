// ReduceInto's fast paths (float/int64 straight into the output, fp16 with F16C) against the
// per-element reference ReduceElement: the same bits for every type and op, on random bit
// patterns (NaN, Inf, subnormals included), odd counts, 2..5 sources, and the output aliasing
// each source in turn as two-shot's does.
#include "kernels/host/element_loops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/element_ops.h"

namespace commd::kernels {
namespace {

bool IsNanBits(DataType t, const std::byte* p) {
  switch (t) {
    case DataType::kFloat32: {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return (u & 0x7fffffffu) > 0x7f800000u;
    }
    case DataType::kFloat64: {
      uint64_t u;
      std::memcpy(&u, p, 8);
      return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    }
    case DataType::kFloat16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      return (u & 0x7fffu) > 0x7c00u;
    }
    case DataType::kBFloat16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      return (u & 0x7fffu) > 0x7f80u;
    }
    default:
      return false;
  }
}

// Reference: ReduceElement for element i, into `out` (element_size bytes).
void Reference(DataType type, ReduceOp op, const std::vector<const std::byte*>& srcs, size_t i,
               int world, std::byte* out) {
  DispatchType(type, [&]<typename T>() {
    std::vector<const T*> typed;
    for (const std::byte* s : srcs) typed.push_back(reinterpret_cast<const T*>(s));
    T v{};
    const bool defined = DispatchReduceOp<T>(op, [&]<ReduceOp Op>() {
      v = ReduceElement<T, Op>(typed.data(), static_cast<int>(typed.size()), i, world);
    });
    ASSERT_TRUE(defined) << ReduceOpName(op) << " of " << DataTypeName(type);
    std::memcpy(out, &v, sizeof(T));
  });
}

TEST(ReduceIntoTest, FastPathsMatchTheElementReference) {
  std::mt19937_64 rng(0x5eed);
  for (const DataType type : kCollectiveTypes) {
    const size_t es = DataTypeSize(type);
    for (int o = 0; o < kReduceOpCount; ++o) {
      const ReduceOp op = static_cast<ReduceOp>(o);
      if (!ReduceOpApplies(op, type)) continue;  // bool's avg: refused before any loop
      for (int nsrc = 2; nsrc <= 5; ++nsrc) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{2049}, size_t{5003}}) {
          // alias = -1: separate output; else the output is source `alias` itself.
          for (int alias = -1; alias < nsrc; ++alias) {
            std::vector<std::vector<std::byte>> data(nsrc, std::vector<std::byte>(count * es));
            for (auto& d : data) {
              for (auto& b : d) b = static_cast<std::byte>(rng());
            }
            std::vector<const std::byte*> srcs;
            for (auto& d : data) srcs.push_back(d.data());
            std::vector<std::byte> want(count * es);
            for (size_t i = 0; i < count; ++i) {
              Reference(type, op, srcs, i, nsrc, want.data() + i * es);
            }
            std::vector<std::byte> separate(count * es);
            std::byte* out = alias < 0 ? separate.data() : data[alias].data();
            ReduceInto(type, op, srcs.data(), nsrc, 0, count, out, nsrc);
            for (size_t i = 0; i < count; ++i) {
              const std::byte* g = out + i * es;
              const std::byte* w = want.data() + i * es;
              if (IsNanBits(type, w)) {
                ASSERT_TRUE(IsNanBits(type, g)) << "element " << i;
                continue;
              }
              ASSERT_EQ(std::memcmp(g, w, es), 0)
                  << DataTypeName(type) << " " << ReduceOpName(op) << " nsrc " << nsrc << " count "
                  << count << " alias " << alias << " element " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace commd::kernels
