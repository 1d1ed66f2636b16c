// commd's one vocabulary: which collective, which element type, which reduce op. Each is one
// row below; the enums, the names both ways (SDK, PyTorch, messages, commd-bench), the
// flight recorder's op and dtype codes and the checks of what a collective takes all come
// from the rows, so adding a type or an op is one row plus its kernels' cases.
//
//   commd::DataType t;
//   if (commd::DataTypeFromName("bfloat16", &t)) bytes = count * commd::DataTypeSize(t);
//   commd::CollectiveInfo(commd::CollectiveOp::kBroadcast).words  // "broadcast"
//
// A leaf: it includes only the standard library, so the kernels (device code too), the
// control block's ABI and the daemon include it, and the SDK's public headers re-export it
// (commd/types.h, commd/collective_op.h). It is installed with them as commd/vocabulary.h.
// The lookups are constexpr and allocate nothing; every function here is thread-safe.
//
// Values are ABIs (the ring's op and dtype codes, common/control_block.h): never renumber,
// only append.
#ifndef COMMD_COMMON_INCLUDE_COMMD_VOCABULARY_H_
#define COMMD_COMMON_INCLUDE_COMMD_VOCABULARY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

// Collectives. X(Name, value, torch, words, bench, kind, recorded_as, flags):
// - Name: the enumerator (kName) and the SDK's name (Group::Name).
// - torch: PyTorch's name; for an op with a ring code (kRing), the one its flight recorder and
//   analyzer write after "<lib>:", else the symm_mem op it matches.
// - words: how messages name it ("all-reduce tensor 0 ...").
// - bench: commd-bench's -o name (nullptr: not benchmarked).
// - kind: every rank alike, rooted (a root rank), point-to-point (a peer), or a recorder mark.
// - recorded_as: the op of the flight-recorder entry the SDK makes for the call.
// - flags: kRing (a ring op code, below kRecordOpCount), kTyped (count and dtype describe
//   data), kReduces (takes a ReduceOp), kOneBuffer (in and out may be one buffer), kWideIn /
//   kWideOut (the input / output holds world_size x count elements).
#define COMMD_COLLECTIVES(X)                                                                       \
  X(AllReduce, 0, "all_reduce", "all-reduce", "allreduce", kAllRanks, AllReduce,                   \
    kRing | kTyped | kReduces | kOneBuffer)                                                        \
  X(AllGather, 1, "all_gather", "all-gather", "allgather", kAllRanks, AllGather,                   \
    kRing | kTyped | kWideOut)                                                                     \
  X(ReduceScatter, 2, "reduce_scatter", "reduce-scatter", "reducescatter", kAllRanks,              \
    ReduceScatter, kRing | kTyped | kReduces | kWideIn)                                            \
  X(Broadcast, 3, "broadcast", "broadcast", "broadcast", kRooted, Broadcast,                       \
    kRing | kTyped | kOneBuffer)                                                                   \
  X(Reduce, 4, "reduce", "reduce", nullptr, kRooted, Reduce,                                       \
    kRing | kTyped | kReduces | kOneBuffer)                                                        \
  X(Barrier, 5, "barrier", "barrier", "barrier", kAllRanks, Barrier, kRing | kOneBuffer)           \
  X(AllToAll, 6, "all_to_all", "all-to-all", "alltoall", kAllRanks, AllToAll,                      \
    kRing | kTyped | kWideIn | kWideOut)                                                           \
  X(Gather, 7, "gather", "gather", nullptr, kRooted, Gather, kRing | kTyped | kWideOut)            \
  X(Scatter, 8, "scatter", "scatter", nullptr, kRooted, Scatter, kRing | kTyped | kWideIn)         \
  X(Send, 9, "send", "send", nullptr, kPointToPoint, Send, kRing | kTyped | kOneBuffer)            \
  X(Recv, 10, "recv", "recv", nullptr, kPointToPoint, Recv, kRing | kTyped | kOneBuffer)           \
  /* Closes a coalesced group whose members share a sequence id (recorder only). */                \
  X(Coalesced, 11, "coalesced", "coalesced", nullptr, kMark, Coalesced, kRing | kOneBuffer)        \
  /* Many tensors as one call; the SDK records Group::AllReduceCoalesced as an AllReduce. */       \
  X(AllReduceCoalesced, 12, "allreduce_coalesced", "all-reduce", "allreduce_coalesced", kAllRanks, \
    AllReduce, kRing | kTyped | kReduces | kOneBuffer)                                             \
  X(AllGatherCoalesced, 13, "all_gather_into_tensor_coalesced", "all-gather", nullptr, kAllRanks,  \
    AllGather, kRing | kTyped | kWideOut)                                                          \
  X(ReduceScatterCoalesced, 14, "reduce_scatter_tensor_coalesced", "reduce-scatter", nullptr,      \
    kAllRanks, ReduceScatter, kRing | kTyped | kReduces | kWideIn)                                 \
  /* The fused matmuls: SDK calls only. One buffer (A's shard, or the workspace) that the          \
     matmul's own checks size. */                                                                  \
  X(AllGatherMatmul, 15, "fused_all_gather_matmul", "all-gather-matmul", nullptr, kAllRanks,       \
    AllGather, kTyped | kOneBuffer)                                                                \
  X(MatmulReduceScatter, 16, "fused_matmul_reduce_scatter", "matmul-reduce-scatter", nullptr,      \
    kAllRanks, ReduceScatter, kTyped | kReduces | kOneBuffer)

// Element types. X(Name, value, name, scalar, bytes, nccl, alias, flags):
// - value: the ring's dtype code.
// - name: PyTorch's and numpy's dtype name without "torch." ("bfloat16"), also the SDK's.
// - scalar: PyTorch's ScalarType name (c10::toString), what its flight recorder writes.
// - nccl, alias: commd-bench's other names for it (nccl-tests' and a short one; nullptr: none).
// - flags: kFloat (the NaN/Inf check applies), kCollectiveType (the SDK's collectives take
//   it; the others can be recorded, e.g. for NCCL collectives through Group::recorder()).
#define COMMD_DATA_TYPES(X)                                                               \
  X(Float32, 0, "float32", "Float", 4, "float", "fp32", kFloat | kCollectiveType)         \
  X(Float16, 1, "float16", "Half", 2, "half", "fp16", kFloat | kCollectiveType)           \
  X(BFloat16, 2, "bfloat16", "BFloat16", 2, "bfloat16", "bf16", kFloat | kCollectiveType) \
  X(Int32, 3, "int32", "Int", 4, "int32", "int", kCollectiveType)                         \
  X(Int64, 4, "int64", "Long", 8, "int64", nullptr, kCollectiveType)                      \
  X(Float64, 5, "float64", "Double", 8, "double", "fp64", kFloat | kCollectiveType)       \
  X(Int8, 6, "int8", "Char", 1, "int8", nullptr, kCollectiveType)                         \
  X(UInt8, 7, "uint8", "Byte", 1, "uint8", nullptr, kCollectiveType)                      \
  X(Bool, 8, "bool", "Bool", 1, nullptr, nullptr, kCollectiveType)                        \
  X(Int16, 9, "int16", "Short", 2, nullptr, nullptr, kCollectiveType)                     \
  X(Float8E4M3, 10, "float8_e4m3fn", "Float8_e4m3fn", 1, "f8e4m3", nullptr, kFloat)       \
  X(Float8E5M2, 11, "float8_e5m2", "Float8_e5m2", 1, "f8e5m2", nullptr, kFloat)

// Reductions. X(Name, value, name, applies): `applies` is which element types it is defined
// on (kAnyType: every collective type; kNotBool: all but bool, as in NCCL and PyTorch;
// kIntegral: the integer types and bool, as PyTorch's BAND/BOR/BXOR). `name` is PyTorch's
// ReduceOp name in lower case.
// Integers (int8 to int64, uint8) accumulate in int64 and are stored back as the result's low
// bits, so sums and products wrap at the type's width as NCCL's do; avg divides the int64 sum
// by the world size, truncating toward zero, before it is stored; band, bor and bxor act on
// the two's complement bits. bool reads any nonzero byte as true and writes 0 or 1: sum is
// logical or (as NCCL's bool sum, which PyTorch maps to max), product and min are logical
// and, max is logical or, band / bor / bxor are and / or / xor (xor: an odd number of trues).
// Floating-point types accumulate in float (fp16, bf16, fp32) or double (fp64) in rank order
// and round once when stored; product overflows to +-Inf and underflows to 0 as IEEE does.
#define COMMD_REDUCE_OPS(X)          \
  X(Sum, 0, "sum", kAnyType)         \
  X(Avg, 1, "avg", kNotBool)         \
  X(Min, 2, "min", kAnyType)         \
  X(Max, 3, "max", kAnyType)         \
  X(Product, 4, "product", kAnyType) \
  X(BAnd, 5, "band", kIntegral)      \
  X(BOr, 6, "bor", kIntegral)        \
  X(BXor, 7, "bxor", kIntegral)

namespace commd {

#define COMMD_VOCABULARY_ENUMERATOR(Name, value, ...) k##Name = value,
enum class CollectiveOp { COMMD_COLLECTIVES(COMMD_VOCABULARY_ENUMERATOR) };
enum class DataType { COMMD_DATA_TYPES(COMMD_VOCABULARY_ENUMERATOR) };
enum class ReduceOp { COMMD_REDUCE_OPS(COMMD_VOCABULARY_ENUMERATOR) };
#undef COMMD_VOCABULARY_ENUMERATOR

namespace vocabulary {

enum CollectiveKind : uint8_t { kAllRanks, kRooted, kPointToPoint, kMark };
enum CollectiveFlags : uint8_t {
  kRing = 1u << 0,
  kTyped = 1u << 1,
  kReduces = 1u << 2,
  kOneBuffer = 1u << 3,
  kWideIn = 1u << 4,
  kWideOut = 1u << 5,
};
enum DataTypeFlags : uint8_t { kFloat = 1u << 0, kCollectiveType = 1u << 1 };
enum ReduceApplies : uint8_t { kAnyType, kNotBool, kIntegral };

struct CollectiveRow {
  CollectiveOp op;
  const char* sdk;    // "AllReduce"
  const char* torch;  // "all_reduce"
  const char* words;  // "all-reduce"
  const char* bench;  // "allreduce"; nullptr: not benchmarked
  CollectiveKind kind;
  CollectiveOp recorded_as;
  uint8_t flags;  // CollectiveFlags

  constexpr bool ring() const { return flags & kRing; }
  constexpr bool typed() const { return flags & kTyped; }
  constexpr bool reduces() const { return flags & kReduces; }
  constexpr bool one_buffer() const { return flags & kOneBuffer; }
  constexpr bool wide_in() const { return flags & kWideIn; }
  constexpr bool wide_out() const { return flags & kWideOut; }
  constexpr bool rooted() const { return kind == kRooted; }
  constexpr bool point_to_point() const { return kind == kPointToPoint; }
};

struct DataTypeRow {
  DataType type;
  const char* name;    // "bfloat16"
  const char* scalar;  // "BFloat16"
  uint8_t bytes;
  const char* nccl;   // nullptr: none
  const char* alias;  // nullptr: none
  uint8_t flags;      // DataTypeFlags

  constexpr bool is_float() const { return flags & kFloat; }
  constexpr bool collective() const { return flags & kCollectiveType; }
};

struct ReduceOpRow {
  ReduceOp op;
  const char* name;  // "sum"
  ReduceApplies applies;
};

#define COMMD_VOCABULARY_COLLECTIVE_ROW(Name, value, torch, words, bench, kind, recorded, flags) \
  CollectiveRow{                                                                                 \
      CollectiveOp::k##Name,      #Name, torch, words, bench, kind, CollectiveOp::k##recorded,   \
      static_cast<uint8_t>(flags)},
#define COMMD_VOCABULARY_TYPE_ROW(Name, value, name, scalar, bytes, nccl, alias, flags) \
  DataTypeRow{DataType::k##Name, name, scalar, bytes, nccl, alias, static_cast<uint8_t>(flags)},
#define COMMD_VOCABULARY_REDUCE_ROW(Name, value, name, applies) \
  ReduceOpRow{ReduceOp::k##Name, name, applies},

inline constexpr CollectiveRow kCollectives[] = {
    COMMD_COLLECTIVES(COMMD_VOCABULARY_COLLECTIVE_ROW)};
inline constexpr DataTypeRow kDataTypes[] = {COMMD_DATA_TYPES(COMMD_VOCABULARY_TYPE_ROW)};
inline constexpr ReduceOpRow kReduceOps[] = {COMMD_REDUCE_OPS(COMMD_VOCABULARY_REDUCE_ROW)};

#undef COMMD_VOCABULARY_COLLECTIVE_ROW
#undef COMMD_VOCABULARY_TYPE_ROW
#undef COMMD_VOCABULARY_REDUCE_ROW

// Each table is indexed by value: a row's value is its position.
static_assert([] {
  for (size_t i = 0; i < std::size(kCollectives); ++i) {
    if (static_cast<size_t>(kCollectives[i].op) != i) return false;
  }
  for (size_t i = 0; i < std::size(kDataTypes); ++i) {
    if (static_cast<size_t>(kDataTypes[i].type) != i) return false;
  }
  for (size_t i = 0; i < std::size(kReduceOps); ++i) {
    if (static_cast<size_t>(kReduceOps[i].op) != i) return false;
  }
  return true;
}());

inline constexpr CollectiveRow kUnknownCollective{
    static_cast<CollectiveOp>(-1), "?", "?", "?", nullptr, kMark, CollectiveOp::kBarrier, 0};
inline constexpr DataTypeRow kUnknownDataType{
    static_cast<DataType>(-1), "?", "?", 0, nullptr, nullptr, 0};
inline constexpr ReduceOpRow kUnknownReduceOp{static_cast<ReduceOp>(-1), "?", kAnyType};

}  // namespace vocabulary

inline constexpr int kCollectiveOpCount = static_cast<int>(std::size(vocabulary::kCollectives));
inline constexpr int kDataTypeCount = static_cast<int>(std::size(vocabulary::kDataTypes));
inline constexpr int kReduceOpCount = static_cast<int>(std::size(vocabulary::kReduceOps));

constexpr bool IsValid(CollectiveOp op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) < kCollectiveOpCount;
}
constexpr bool IsValid(DataType t) {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) < kDataTypeCount;
}
constexpr bool IsValid(ReduceOp op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) < kReduceOpCount;
}

// The types the SDK's collectives take (flagged kCollectiveType), in value order.
inline constexpr int kCollectiveTypeCount = [] {
  int n = 0;
  for (const auto& r : vocabulary::kDataTypes) n += r.collective() ? 1 : 0;
  return n;
}();
inline constexpr std::array<DataType, kCollectiveTypeCount> kCollectiveTypes = [] {
  std::array<DataType, kCollectiveTypeCount> out{};
  int n = 0;
  for (const auto& r : vocabulary::kDataTypes) {
    if (r.collective()) out[n++] = r.type;
  }
  return out;
}();

// The row of a value; a row named "?" (and no flags) outside the enum.
constexpr const vocabulary::CollectiveRow& CollectiveInfo(CollectiveOp op) {
  return IsValid(op) ? vocabulary::kCollectives[static_cast<int>(op)]
                     : vocabulary::kUnknownCollective;
}
constexpr const vocabulary::DataTypeRow& DataTypeInfo(DataType t) {
  return IsValid(t) ? vocabulary::kDataTypes[static_cast<int>(t)] : vocabulary::kUnknownDataType;
}
constexpr const vocabulary::ReduceOpRow& ReduceOpInfo(ReduceOp op) {
  return IsValid(op) ? vocabulary::kReduceOps[static_cast<int>(op)] : vocabulary::kUnknownReduceOp;
}

// Bytes per element; 0 outside the enum.
constexpr size_t DataTypeSize(DataType t) { return DataTypeInfo(t).bytes; }
// "float32", "sum"; "?" outside the enum.
constexpr const char* DataTypeName(DataType t) { return DataTypeInfo(t).name; }
constexpr const char* ReduceOpName(ReduceOp op) { return ReduceOpInfo(op).name; }
// Whether the NaN/Inf check applies (floating-point types).
constexpr bool IsFloatingPoint(DataType t) { return DataTypeInfo(t).is_float(); }
// Whether the SDK's collectives (and the kernels) take the type.
constexpr bool IsCollectiveType(DataType t) { return DataTypeInfo(t).collective(); }
// Whether `op` is defined on `t` (a collective type).
constexpr bool ReduceOpApplies(ReduceOp op, DataType t) {
  if (!IsValid(op) || !IsCollectiveType(t)) return false;
  switch (ReduceOpInfo(op).applies) {
    case vocabulary::kAnyType:
      return true;
    case vocabulary::kNotBool:
      return t != DataType::kBool;
    case vocabulary::kIntegral:
      return !IsFloatingPoint(t);
  }
  return false;
}

// One tensor argument of a recorded collective (Recorder::Begin, the ring's writer): `dims`
// (borrowed for the call) holds `ndim` sizes; ndim 0 is a scalar.
struct TensorDesc {
  const int64_t* dims = nullptr;
  uint32_t ndim = 0;
  DataType dtype = DataType::kFloat32;
};

// "all_reduce": PyTorch's name; "?" outside the enum.
constexpr const char* CollectiveName(CollectiveOp op) { return CollectiveInfo(op).torch; }

// Name lookups: true and the value when `name` is a row's (the torch name of an op with a
// ring code; a type's name, with or without "torch.", or its scalar name).
constexpr bool CollectiveFromTorchName(std::string_view name, CollectiveOp* op) {
  for (const auto& r : vocabulary::kCollectives) {
    if (r.ring() && name == r.torch) {
      *op = r.op;
      return true;
    }
  }
  return false;
}
constexpr bool DataTypeFromName(std::string_view name, DataType* t) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  for (const auto& r : vocabulary::kDataTypes) {
    if (name == r.name || name == r.scalar) {
      *t = r.type;
      return true;
    }
  }
  return false;
}
constexpr bool ReduceOpFromName(std::string_view name, ReduceOp* op) {
  for (const auto& r : vocabulary::kReduceOps) {
    if (name == r.name) {
      *op = r.op;
      return true;
    }
  }
  return false;
}

}  // namespace commd

#endif  // COMMD_COMMON_INCLUDE_COMMD_VOCABULARY_H_
