#include "tests/integration/typed_elements.h"

#include <cstdint>

#include "kernels/element_ops.h"

namespace commd::testing {

namespace k = commd::kernels;

size_t Size(DataType t) { return ::commd::DataTypeSize(static_cast<::commd::DataType>(t)); }

void Store(void* p, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat16:
      static_cast<k::Half*>(p)[i] = k::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<k::BFloat16*>(p)[i] = k::FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case DataType::kBool:
      static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0;
      break;
    default:
      break;
  }
}

double Load(const void* p, size_t i, DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat16:
      return k::HalfToFloat(static_cast<const k::Half*>(p)[i]);
    case DataType::kBFloat16:
      return k::BFloat16ToFloat(static_cast<const k::BFloat16*>(p)[i]);
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt16:
      return static_cast<const int16_t*>(p)[i];
    case DataType::kBool:
      return static_cast<const uint8_t*>(p)[i] != 0 ? 1 : 0;
    default:
      return 0;
  }
}

double Narrow(DataType t, uint64_t u) {
  switch (t) {
    case DataType::kInt8:
      return static_cast<int8_t>(static_cast<uint8_t>(u));
    case DataType::kUInt8:
      return static_cast<uint8_t>(u);
    case DataType::kInt16:
      return static_cast<int16_t>(static_cast<uint16_t>(u));
    case DataType::kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(u));
    case DataType::kBool:
      return u != 0 ? 1 : 0;
    default:
      return static_cast<double>(static_cast<int64_t>(u));
  }
}

}  // namespace commd::testing
