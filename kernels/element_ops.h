// Per-element operations of the collectives, shared by the CPU and CUDA implementations:
// loading an element into its accumulator type, combining two accumulators under a ReduceOp,
// finishing (kAvg divides by the world size), storing back, and the NaN/Inf test.
//
//   float acc = ToAcc(a[i]);                       // fp16/bf16/fp32 accumulate in float
//   acc = Combine<ReduceOp::kMax>(acc, ToAcc(b[i]));
//   out[i] = FromAcc<Half>(Finalize<ReduceOp::kMax>(acc, world_size));
//
// Accumulators: float for fp32, fp16 and bf16; double for fp64; int64 for the narrower integers
// and bool (so kAvg is exact; the result keeps the low bits, so sums wrap at the type's width,
// as NCCL's do); int64 with wrapping (two's complement) arithmetic for int64. bool loads any
// nonzero byte as 1 and stores 0 or 1, so its sum is a logical or (commd/vocabulary.h defines
// each op on each type). kProduct multiplies in the same accumulators (int64 keeps the low 64
// bits); kBAnd/Or/Xor act on the int64 accumulator's bits, which are the element's
// sign- or zero-extended, so the stored low bits are the element-wise result. kMin and kMax
// propagate NaN. Every rank reduces in rank order 0..world-1,
// so all ranks get bit-identical results.
#ifndef COMMD_KERNELS_ELEMENT_OPS_H_
#define COMMD_KERNELS_ELEMENT_OPS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/float16.h"
#include "kernels/host_device.h"
#include "kernels/types.h"

namespace commd::kernels {

// bool's storage: one byte, read as true when nonzero (a C++ bool holding 2 is undefined).
struct Bool8 {
  uint8_t bits;
};

template <typename T>
struct ElementTraits;
template <>
struct ElementTraits<float> {
  using Acc = float;
  static constexpr DataType kType = DataType::kFloat32;
};
template <>
struct ElementTraits<Half> {
  using Acc = float;
  static constexpr DataType kType = DataType::kFloat16;
};
template <>
struct ElementTraits<BFloat16> {
  using Acc = float;
  static constexpr DataType kType = DataType::kBFloat16;
};
template <>
struct ElementTraits<double> {
  using Acc = double;
  static constexpr DataType kType = DataType::kFloat64;
};
template <>
struct ElementTraits<int32_t> {
  using Acc = int64_t;
  static constexpr DataType kType = DataType::kInt32;
};
template <>
struct ElementTraits<int64_t> {
  using Acc = int64_t;
  static constexpr DataType kType = DataType::kInt64;
};
template <>
struct ElementTraits<int8_t> {
  using Acc = int64_t;
  static constexpr DataType kType = DataType::kInt8;
};
template <>
struct ElementTraits<uint8_t> {
  using Acc = int64_t;
  static constexpr DataType kType = DataType::kUInt8;
};
template <>
struct ElementTraits<int16_t> {
  using Acc = int64_t;
  static constexpr DataType kType = DataType::kInt16;
};
template <>
struct ElementTraits<Bool8> {
  using Acc = int64_t;
  static constexpr DataType kType = DataType::kBool;
};
template <typename T>
using AccType = typename ElementTraits<T>::Acc;

COMMD_HOST_DEVICE inline float ToAcc(float v) { return v; }
COMMD_HOST_DEVICE inline float ToAcc(Half v) { return HalfToFloat(v); }
COMMD_HOST_DEVICE inline float ToAcc(BFloat16 v) { return BFloat16ToFloat(v); }
COMMD_HOST_DEVICE inline double ToAcc(double v) { return v; }
COMMD_HOST_DEVICE inline int64_t ToAcc(int32_t v) { return v; }
COMMD_HOST_DEVICE inline int64_t ToAcc(int64_t v) { return v; }
COMMD_HOST_DEVICE inline int64_t ToAcc(int8_t v) { return v; }
COMMD_HOST_DEVICE inline int64_t ToAcc(uint8_t v) { return v; }
COMMD_HOST_DEVICE inline int64_t ToAcc(int16_t v) { return v; }
COMMD_HOST_DEVICE inline int64_t ToAcc(Bool8 v) { return v.bits != 0 ? 1 : 0; }

template <typename T>
COMMD_HOST_DEVICE inline T FromAcc(AccType<T> a);
template <>
COMMD_HOST_DEVICE inline float FromAcc<float>(float a) {
  return a;
}
template <>
COMMD_HOST_DEVICE inline Half FromAcc<Half>(float a) {
  return FloatToHalf(a);
}
template <>
COMMD_HOST_DEVICE inline BFloat16 FromAcc<BFloat16>(float a) {
  return FloatToBFloat16(a);
}
template <>
COMMD_HOST_DEVICE inline double FromAcc<double>(double a) {
  return a;
}
template <>
COMMD_HOST_DEVICE inline int32_t FromAcc<int32_t>(int64_t a) {
  // Keeps the low 32 bits: the wrapped int32 sum.
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(a)));
}
template <>
COMMD_HOST_DEVICE inline int64_t FromAcc<int64_t>(int64_t a) {
  return a;
}
// The low 8 or 16 bits, as int32's low 32.
template <>
COMMD_HOST_DEVICE inline int8_t FromAcc<int8_t>(int64_t a) {
  return static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint64_t>(a)));
}
template <>
COMMD_HOST_DEVICE inline uint8_t FromAcc<uint8_t>(int64_t a) {
  return static_cast<uint8_t>(static_cast<uint64_t>(a));
}
template <>
COMMD_HOST_DEVICE inline int16_t FromAcc<int16_t>(int64_t a) {
  return static_cast<int16_t>(static_cast<uint16_t>(static_cast<uint64_t>(a)));
}
template <>
COMMD_HOST_DEVICE inline Bool8 FromAcc<Bool8>(int64_t a) {
  return Bool8{static_cast<uint8_t>(a != 0 ? 1 : 0)};
}

COMMD_HOST_DEVICE inline bool IsNan(float a) { return a != a; }
COMMD_HOST_DEVICE inline bool IsNan(double a) { return a != a; }
COMMD_HOST_DEVICE inline bool IsNan(int64_t) { return false; }

COMMD_HOST_DEVICE inline float AddAcc(float a, float b) { return a + b; }
COMMD_HOST_DEVICE inline double AddAcc(double a, double b) { return a + b; }
COMMD_HOST_DEVICE inline int64_t AddAcc(int64_t a, int64_t b) {
  // Unsigned arithmetic: wraps instead of overflowing (undefined for signed types).
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

COMMD_HOST_DEVICE inline float MulAcc(float a, float b) { return a * b; }
COMMD_HOST_DEVICE inline double MulAcc(double a, double b) { return a * b; }
COMMD_HOST_DEVICE inline int64_t MulAcc(int64_t a, int64_t b) {
  // As AddAcc: the low 64 bits of the product, so narrower types keep their wrapped product.
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Whether Combine<Op> is defined on accumulator A: the bitwise ops on the integer ones only
// (commd/vocabulary.h's kIntegral; ReduceOpApplies refuses the others before any kernel).
template <ReduceOp Op, typename A>
inline constexpr bool kCombines =
    !(Op == ReduceOp::kBAnd || Op == ReduceOp::kBOr || Op == ReduceOp::kBXor) ||
    std::is_integral_v<A>;

template <ReduceOp Op, typename A>
COMMD_HOST_DEVICE inline A Combine(A a, A b) {
  static_assert(kCombines<Op, A>, "a bitwise reduce op of a floating-point type");
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) {
    return AddAcc(a, b);
  } else if constexpr (Op == ReduceOp::kProduct) {
    return MulAcc(a, b);
  } else if constexpr (Op == ReduceOp::kBAnd) {
    return a & b;
  } else if constexpr (Op == ReduceOp::kBOr) {
    return a | b;
  } else if constexpr (Op == ReduceOp::kBXor) {
    return a ^ b;
  } else if constexpr (Op == ReduceOp::kMin) {
    if (IsNan(a)) return a;
    if (IsNan(b)) return b;
    return b < a ? b : a;
  } else {
    static_assert(Op == ReduceOp::kMax);
    if (IsNan(a)) return a;
    if (IsNan(b)) return b;
    return b > a ? b : a;
  }
}

template <ReduceOp Op, typename A>
COMMD_HOST_DEVICE inline A Finalize(A a, int world_size) {
  if constexpr (Op == ReduceOp::kAvg) {
    return a / static_cast<A>(world_size);
  } else {
    return a;
  }
}

// Reduces element `i` of `n` sources in source order (rank order when srcs[p] is rank p's).
template <typename T, ReduceOp Op>
COMMD_HOST_DEVICE inline T ReduceElement(const T* const* srcs, int n, size_t i, int world_size) {
  AccType<T> acc = ToAcc(srcs[0][i]);
  for (int p = 1; p < n; ++p) acc = Combine<Op>(acc, ToAcc(srcs[p][i]));
  return FromAcc<T>(Finalize<Op>(acc, world_size));
}

// NaN or +-Inf: the exponent field is all ones. Integers are always finite.
COMMD_HOST_DEVICE inline bool IsNonFinite(float v) {
  return (FloatBits(v) & 0x7f800000u) == 0x7f800000u;
}
COMMD_HOST_DEVICE inline bool IsNonFinite(double v) {
#if defined(__CUDA_ARCH__)
  const uint64_t bits = static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
#endif
  return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
COMMD_HOST_DEVICE inline bool IsNonFinite(Half v) { return (v.bits & 0x7c00u) == 0x7c00u; }
COMMD_HOST_DEVICE inline bool IsNonFinite(BFloat16 v) { return (v.bits & 0x7f80u) == 0x7f80u; }
COMMD_HOST_DEVICE inline bool IsNonFinite(int32_t) { return false; }
COMMD_HOST_DEVICE inline bool IsNonFinite(int64_t) { return false; }
COMMD_HOST_DEVICE inline bool IsNonFinite(int8_t) { return false; }
COMMD_HOST_DEVICE inline bool IsNonFinite(uint8_t) { return false; }
COMMD_HOST_DEVICE inline bool IsNonFinite(int16_t) { return false; }
COMMD_HOST_DEVICE inline bool IsNonFinite(Bool8) { return false; }

// Calls f.template operator()<T>() with T the storage type of `t`; returns false (without
// calling) for a value outside the enum.
template <typename F>
COMMD_HOST_DEVICE inline bool DispatchType(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat32:
      f.template operator()<float>();
      return true;
    case DataType::kFloat16:
      f.template operator()<Half>();
      return true;
    case DataType::kBFloat16:
      f.template operator()<BFloat16>();
      return true;
    case DataType::kFloat64:
      f.template operator()<double>();
      return true;
    case DataType::kInt32:
      f.template operator()<int32_t>();
      return true;
    case DataType::kInt64:
      f.template operator()<int64_t>();
      return true;
    case DataType::kInt8:
      f.template operator()<int8_t>();
      return true;
    case DataType::kUInt8:
      f.template operator()<uint8_t>();
      return true;
    case DataType::kBool:
      f.template operator()<Bool8>();
      return true;
    case DataType::kInt16:
      f.template operator()<int16_t>();
      return true;
    default:  // not a collective type (IsCollectiveType)
      return false;
  }
}

// f.template operator()<Op>() when Op is defined on T's accumulator (kCombines), and true;
// else false, instantiating nothing. Device code is C++17, so `f` is a functor, not a
// lambda with template parameters.
template <typename T, ReduceOp Op, typename F>
inline bool CallWithOp(F& f) {
  if constexpr (kCombines<Op, AccType<T>>) {
    f.template operator()<Op>();
    return true;
  } else {
    return false;
  }
}

// Calls f.template operator()<Op>() with Op the value of `op`, for the ops defined on T's
// accumulator (no bitwise op of a floating-point type is instantiated); returns false
// (without calling) for any other value. Every reduction kernel dispatches through this, so
// an op is one row in commd/vocabulary.h, one case in Combine and one case here.
template <typename T, typename F>
inline bool DispatchReduceOp(ReduceOp op, F&& f) {
  static_assert(kReduceOpCount == 8, "a new reduce op needs its case below");
  switch (op) {
    case ReduceOp::kSum:
      return CallWithOp<T, ReduceOp::kSum>(f);
    case ReduceOp::kAvg:
      return CallWithOp<T, ReduceOp::kAvg>(f);
    case ReduceOp::kMin:
      return CallWithOp<T, ReduceOp::kMin>(f);
    case ReduceOp::kMax:
      return CallWithOp<T, ReduceOp::kMax>(f);
    case ReduceOp::kProduct:
      return CallWithOp<T, ReduceOp::kProduct>(f);
    case ReduceOp::kBAnd:
      return CallWithOp<T, ReduceOp::kBAnd>(f);
    case ReduceOp::kBOr:
      return CallWithOp<T, ReduceOp::kBOr>(f);
    case ReduceOp::kBXor:
      return CallWithOp<T, ReduceOp::kBXor>(f);
  }
  return false;
}

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_ELEMENT_OPS_H_
