#pragma once
#include <cstdint>
#include <string>

namespace rankscope {

// 16 lower-case hex digits.
std::string hex64(uint64_t value);
// ISO-8601 UTC with microseconds, e.g. 2026-11-21T23:05:01.123456Z; "-" for 0.
std::string format_time_ns(uint64_t realtime_ns);
// "12.3 s", "450 ms", "3.2 µs"-style duration.
std::string format_duration_ns(int64_t ns);
// JSON string literal with escapes, quotes included.
std::string json_quote(const std::string& text);

}  // namespace rankscope
