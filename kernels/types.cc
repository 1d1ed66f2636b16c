#include "kernels/types.h"

namespace commd::kernels {

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "?";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
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
