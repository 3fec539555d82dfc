#include "tools/fakenccl/error.h"

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

namespace rankscope::fakenccl {
namespace {

struct LastError {
  std::mutex mu;
  std::string text;
};

// Never destroyed: stream workers may report while the process exits.
LastError& lastError() {
  static LastError* instance = new LastError;
  return *instance;
}

std::string format(const char* format, va_list args) {
  char buffer[1024];
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  return buffer;
}

// One fprintf per line so that lines from concurrent threads never interleave.
void printLine(const std::string& message) {
  std::fprintf(stderr, "fakenccl: %s\n", message.c_str());
}

}  // namespace

ncclResult_t fail(ncclResult_t code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string message = format(fmt, args);
  va_end(args);
  printLine(message);
  LastError& last = lastError();
  std::lock_guard lock(last.mu);
  last.text = std::move(message);
  return code;
}

void warn(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string message = format(fmt, args);
  va_end(args);
  printLine(message);
}

const char* lastErrorText() {
  // The caller keeps the pointer; a per-thread copy stays valid until this
  // thread asks again, however often other threads fail meanwhile.
  thread_local std::string copy;
  LastError& last = lastError();
  std::lock_guard lock(last.mu);
  copy = last.text;
  return copy.c_str();
}

}  // namespace rankscope::fakenccl
