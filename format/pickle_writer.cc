#include "format/pickle_writer.h"

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace commd {
namespace {

// Opcodes (Python's Lib/pickletools.py documents them).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt1 = 'K';   // 1-byte unsigned
constexpr char kBinInt2 = 'M';   // 2-byte unsigned, little-endian
constexpr char kBinInt = 'J';    // 4-byte signed, little-endian
constexpr char kLong1 = '\x8a';  // n-byte two's complement, little-endian
constexpr char kBinFloat = 'G';  // 8-byte IEEE 754, big-endian
constexpr char kBinUnicode = 'X';
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kMark = '(';
constexpr char kSetItems = 'u';
constexpr char kAppends = 'e';
constexpr int kMaxDepth = 128;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Minimal two's complement little-endian bytes of a 65-bit value (sign, magnitude bits).
void PutLong1(std::string* out, uint64_t bits, bool negative) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  const char fill = negative ? '\xff' : '\0';
  while (bytes.size() > 1 && bytes.back() == fill &&
         ((bytes[bytes.size() - 2] & 0x80) != 0) == negative) {
    bytes.pop_back();
  }
  // A positive value whose top bit is set needs a zero byte to stay positive.
  if (!negative && (bytes.back() & 0x80) != 0) bytes.push_back('\0');
  out->push_back(kLong1);
  out->push_back(static_cast<char>(bytes.size()));
  out->append(bytes);
}

void PutInt(std::string* out, int64_t v) {
  if (v >= 0 && v <= 0xff) {
    out->push_back(kBinInt1);
    PutLe(out, uint64_t(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    out->push_back(kBinInt2);
    PutLe(out, uint64_t(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out->push_back(kBinInt);
    PutLe(out, uint64_t(uint32_t(int32_t(v))), 4);
  } else {
    PutLong1(out, uint64_t(v), v < 0);
  }
}

void PutUnsigned(std::string* out, uint64_t v) {
  if (v <= uint64_t(INT64_MAX)) return PutInt(out, int64_t(v));
  PutLong1(out, v, false);
}

void PutFloat(std::string* out, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  out->push_back(kBinFloat);
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PutString(std::string* out, const std::string& s) {
  out->push_back(kBinUnicode);
  PutLe(out, s.size(), 4);
  out->append(s);
}

absl::Status Put(std::string* out, const nlohmann::json& v, int depth) {
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat("pickle: nesting deeper than ", kMaxDepth));
  }
  using T = nlohmann::json::value_t;
  switch (v.type()) {
    case T::null:
      out->push_back(kNone);
      return absl::OkStatus();
    case T::boolean:
      out->push_back(v.get<bool>() ? kNewTrue : kNewFalse);
      return absl::OkStatus();
    case T::number_integer:
      PutInt(out, v.get<int64_t>());
      return absl::OkStatus();
    case T::number_unsigned:
      PutUnsigned(out, v.get<uint64_t>());
      return absl::OkStatus();
    case T::number_float:
      PutFloat(out, v.get<double>());
      return absl::OkStatus();
    case T::string:
      PutString(out, v.get_ref<const std::string&>());
      return absl::OkStatus();
    case T::array:
      out->push_back(kEmptyList);
      if (v.empty()) return absl::OkStatus();
      out->push_back(kMark);
      for (const auto& item : v) {
        if (absl::Status st = Put(out, item, depth + 1); !st.ok()) return st;
      }
      out->push_back(kAppends);
      return absl::OkStatus();
    case T::object:
      out->push_back(kEmptyDict);
      if (v.empty()) return absl::OkStatus();
      out->push_back(kMark);
      for (const auto& [key, item] : v.items()) {
        PutString(out, key);
        if (absl::Status st = Put(out, item, depth + 1); !st.ok()) return st;
      }
      out->push_back(kSetItems);
      return absl::OkStatus();
    case T::binary:
    case T::discarded:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pickle: cannot encode a JSON value of type ", v.type_name()));
}

}  // namespace

absl::StatusOr<std::string> EncodePickle(const nlohmann::json& value) {
  std::string out;
  out.push_back(kProto);
  out.push_back('\x02');
  if (absl::Status st = Put(&out, value, 0); !st.ok()) return st;
  out.push_back(kStop);
  return out;
}

absl::StatusOr<std::string> EncodePickleFromJson(std::string_view json_text) {
  // nlohmann's parser also rejects invalid UTF-8 in strings.
  const nlohmann::json value =
      nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("pickle: the input (", json_text.size(),
                                                   " bytes) is not JSON or not valid UTF-8"));
  }
  return EncodePickle(value);
}

}  // namespace commd
