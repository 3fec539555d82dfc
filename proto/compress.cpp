#include "proto/compress.h"

#include <zstd.h>

#include <cstring>
#include <memory>

namespace rankscope::proto {

std::string compress(std::string_view bytes) {
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  // One context per thread, kept, as for decompression: ZSTD_compress
  // makes and frees one per call, 6-9 us more per message of 2-32 KB on the
  // development machine (16 against 8-10 us for 2 KB), which a simulator
  // speaking for a thousand nodes pays thousands of times a second.
  thread_local std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> context(ZSTD_createCCtx(), ZSTD_freeCCtx);
  const size_t n = context ? ZSTD_compressCCtx(context.get(), out.data(), out.size(), bytes.data(), bytes.size(),
                                               ZSTD_CLEVEL_DEFAULT)
                           : ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), ZSTD_CLEVEL_DEFAULT);
  // Only a bound too small fails, and ZSTD_compressBound is not.
  if (ZSTD_isError(n)) return std::string();
  out.resize(n);
  return out;
}

Result<std::string> decompress(std::string_view frame, size_t max_bytes) {
  // A zstd frame of today's format only: not a skippable frame, nor the legacy
  // formats a library build may still decode.
  uint32_t magic = 0;
  if (frame.size() >= sizeof(magic)) std::memcpy(&magic, frame.data(), sizeof(magic));
  if (magic != ZSTD_MAGICNUMBER) return make_error(Errc::protocol, "compressed message: not a zstd frame");
  const size_t whole = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(whole))
    return make_error(Errc::protocol, std::string("compressed message: ") + ZSTD_getErrorName(whole));
  if (whole != frame.size())
    return make_error(Errc::protocol, "compressed message: " + std::to_string(frame.size() - whole) +
                                          " byte(s) after its one zstd frame");
  const unsigned long long size = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR)
    return make_error(Errc::protocol, "compressed message: its zstd frame does not state its size");
  const size_t bound = std::min(max_bytes, kMaxInflation * frame.size() + kInflationFloor);
  if (size > bound)
    return make_error(Errc::protocol, "compressed message of " + std::to_string(frame.size()) + " bytes would be " +
                                          std::to_string(size) + " (at most " + std::to_string(bound) + ")");
  std::string out(static_cast<size_t>(size), '\0');
  // One context per thread, kept: making one per message costs more than a small batch's decompression.
  thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> context(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!context) return make_error(Errc::system, "compressed message: no memory for a zstd context");
  const size_t n = ZSTD_decompressDCtx(context.get(), out.data(), out.size(), frame.data(), frame.size());
  if (ZSTD_isError(n)) return make_error(Errc::protocol, std::string("compressed message: ") + ZSTD_getErrorName(n));
  if (n != out.size())
    return make_error(Errc::protocol, "compressed message: " + std::to_string(n) + " bytes where its frame says " +
                                          std::to_string(out.size()));
  return out;
}

}  // namespace rankscope::proto
