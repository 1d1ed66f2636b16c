// Elements of commd's data types as doubles, for the rank programs that check collectives'
// results (collective_rank, span_collective_rank): every value they use is exact in its type.
#ifndef COMMD_TESTS_INTEGRATION_TYPED_ELEMENTS_H_
#define COMMD_TESTS_INTEGRATION_TYPED_ELEMENTS_H_

#include <cstddef>
#include <cstdint>

#include "commd/types.h"

namespace commd::testing {

size_t Size(DataType t);
// Element i of the array of type `t` at `p`, written (rounded to the type) or read.
void Store(void* p, size_t i, DataType t, double v);
double Load(const void* p, size_t i, DataType t);
// An integer type's result from the two's complement bits of its int64 accumulator: the low
// bits at t's width, as the type stores them (bool: nonzero is 1).
double Narrow(DataType t, uint64_t bits);

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_TYPED_ELEMENTS_H_
