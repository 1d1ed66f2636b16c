#include "kernels/types.h"

#include "absl/strings/str_cat.h"

namespace commd::kernels {

absl::Status CheckCollectiveType(DataType t) {
  if (IsCollectiveType(t)) return absl::OkStatus();
  std::string allowed;
  for (const vocabulary::DataTypeRow& r : vocabulary::kDataTypes) {
    if (r.collective()) absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", r.name);
  }
  const std::string value = IsValid(t)
                                ? absl::StrCat(DataTypeName(t), " (", static_cast<int>(t), ")")
                                : absl::StrCat(static_cast<int>(t));
  return absl::InvalidArgumentError(absl::StrCat("data type ", value, " is not one of ", allowed));
}

absl::Status CheckReduceOp(ReduceOp op, DataType t) {
  if (IsValid(op) && (!IsCollectiveType(t) || ReduceOpApplies(op, t))) return absl::OkStatus();
  std::string allowed;
  for (const vocabulary::ReduceOpRow& r : vocabulary::kReduceOps) {
    if (!IsValid(op) || ReduceOpApplies(r.op, t)) {
      absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", r.name);
    }
  }
  if (!IsValid(op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", static_cast<int>(op), " is not one of ", allowed));
  }
  return absl::InvalidArgumentError(absl::StrCat("reduce op ", ReduceOpName(op),
                                                 " is not defined on ", DataTypeName(t),
                                                 "; allowed on ", DataTypeName(t), ": ", allowed));
}

const char* AlgorithmWords(Algorithm a) {
  switch (a) {
    case Algorithm::kOneShot:
      return "one-shot (every rank reads all peers' inputs)";
    case Algorithm::kTwoShot:
      return "two-shot (reduce-scatter, then all-gather)";
  }
  return "?";
}

const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kOneShot:
      return "one_shot";
    case Algorithm::kTwoShot:
      return "two_shot";
  }
  return "?";
}

}  // namespace commd::kernels
