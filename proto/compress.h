#pragma once
// zstd around a packed agent message: a batch travels as
// AgentMessage.compressed to a collector that said it reads one
// (HelloReply.readsCompact). The reader bounds what one frame may become, so
// that a small message cannot make the collector allocate or parse much more
// than it was sent.
#include <cstddef>
#include <string>
#include <string_view>

#include "common/result.h"

namespace rankscope::proto {

// One zstd frame of `bytes`, its content size in its header.
std::string compress(std::string_view bytes);

// What a frame may become: at most `max_bytes`, and at most kMaxInflation
// times its own size plus kInflationFloor (a packed batch compresses 1.3-4x;
// the bound leaves room for far more, and stops a bomb).
inline constexpr size_t kMaxInflation = 32;
inline constexpr size_t kInflationFloor = 1u << 20;

// Decompresses one whole zstd frame whose header states its content size;
// anything else (several frames, bytes after the frame, no size, a size over
// the bounds, damage) is an error.
Result<std::string> decompress(std::string_view frame, size_t max_bytes);

}  // namespace rankscope::proto
