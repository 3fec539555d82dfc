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
// `value` with `digits` decimals ("%.*f").
std::string format_fixed(double value, int digits);
// A share (0.94) as rankscope prints one: "94%", with a decimal below 10%
// ("4.4%", "0.3%") where a whole number would round a small cost away.
std::string format_percent(double share);
// JSON string literal with escapes, quotes included, by the JSON writer
// (common/json.h): invalid UTF-8 replaced by U+FFFD.
std::string json_quote(const std::string& text);
// `text` with every byte that is not part of a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF)
// replaced by U+FFFD. Names from the agents (jobs, accounts) are the user's
// own bytes; one invalid label makes Prometheus refuse the whole scrape.
std::string valid_utf8(const std::string& text);

}  // namespace rankscope
