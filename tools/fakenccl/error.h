// How the NCCL stand-in reports errors: one line on stderr per failure, the
// same text kept for ncclGetLastError(), and an ncclResult_t for the caller.
#pragma once

#include <nccl.h>

namespace rankscope::fakenccl {

// Prints "fakenccl: <message>" to stderr, keeps the message for
// ncclGetLastError() and returns `code`, so a failing path reads
// `return fail(ncclInvalidArgument, "...", ...);`.
ncclResult_t fail(ncclResult_t code, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Prints "fakenccl: <message>" to stderr: a diagnostic that is not the result
// of an API call (a hang detected on a stream, for example).
void warn(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The last message passed to fail(), on any thread; "" before the first.
const char* lastErrorText();

}  // namespace rankscope::fakenccl

// Returns from the enclosing function when `expr` is not ncclSuccess.
#define FAKENCCL_TRY(expr)                  \
  do {                                      \
    ncclResult_t fakenccl_result_ = (expr); \
    if (fakenccl_result_ != ncclSuccess) {  \
      return fakenccl_result_;              \
    }                                       \
  } while (0)
