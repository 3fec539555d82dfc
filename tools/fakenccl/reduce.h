// NCCL's datatypes and reduction operators, computed on the host.
#pragma once

#include <nccl.h>

#include <array>
#include <cstddef>
#include <span>

namespace rankscope::fakenccl {

// Bytes per element; 0 for a value that is not an ncclDataType_t.
size_t datatypeSize(ncclDataType_t type);

// "float32", "bfloat16", ...; "invalid" for a value that is not a datatype.
const char* datatypeName(ncclDataType_t type);

// A reduction as a collective applies it.
struct Reduction {
  // ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg; ncclSum for a PreMulSum.
  ncclRedOp_t builtin = ncclSum;
  // ncclRedOpCreatePreMulSum: every input is multiplied by a scalar (of the
  // collective's datatype) before the sum. nccl.h: a ncclScalarHostImmediate
  // scalar is read at creation (its bytes are kept here), a ncclScalarDevice
  // one while the collective runs (its address is kept).
  bool preMulSum = false;
  std::array<std::byte, 8> scalar{};
  const void* scalarAddress = nullptr;
};

// dst[i] = inputs[0][i] (op) inputs[1][i] (op) ... for `count` elements,
// folding in the order given (rank order), so that every rank computing an
// element gets the same bits. Half, bfloat16 and fp8 elements are combined in
// float and rounded back to their type after every step, as a device
// reducing in that type would. ncclAvg divides the sum by inputs.size().
// dst must not overlap inputs[1..].
void reduceInOrder(void* dst, std::span<const void* const> inputs, size_t count, ncclDataType_t type,
                   const Reduction& reduction);

}  // namespace rankscope::fakenccl
