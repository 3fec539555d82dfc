#include "common/format.h"

#include <cstdio>
#include <ctime>

#include "common/json.h"

namespace rankscope {

std::string hex64(uint64_t value) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string format_time_ns(uint64_t realtime_ns) {
  if (realtime_ns == 0) return "-";
  time_t seconds = static_cast<time_t>(realtime_ns / 1000000000ull);
  tm parts{};
  gmtime_r(&seconds, &parts);
  char buf[64];
  snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06lluZ", parts.tm_year + 1900, parts.tm_mon + 1,
           parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec,
           static_cast<unsigned long long>((realtime_ns % 1000000000ull) / 1000));
  return buf;
}

std::string format_duration_ns(int64_t ns) {
  char buf[48];
  double v = static_cast<double>(ns);
  double a = v < 0 ? -v : v;
  if (a >= 1e9)
    snprintf(buf, sizeof(buf), "%.2f s", v / 1e9);
  else if (a >= 1e6)
    snprintf(buf, sizeof(buf), "%.2f ms", v / 1e6);
  else if (a >= 1e3)
    snprintf(buf, sizeof(buf), "%.1f us", v / 1e3);
  else
    snprintf(buf, sizeof(buf), "%lld ns", static_cast<long long>(ns));
  return buf;
}

std::string valid_utf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  const size_t n = text.size();
  auto cont = [&](size_t at) { return at < n && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80; };
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = cont(i + 1) ? 2 : 0;
    else if (c >= 0xE0 && c <= 0xEF) {
      unsigned char c1 = i + 1 < n ? static_cast<unsigned char>(text[i + 1]) : 0;
      bool ok = cont(i + 1) && cont(i + 2) && !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
      len = ok ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      unsigned char c1 = i + 1 < n ? static_cast<unsigned char>(text[i + 1]) : 0;
      bool ok = cont(i + 1) && cont(i + 2) && cont(i + 3) && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
      len = ok ? 4 : 0;
    }
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

std::string format_fixed(double value, int digits) {
  char buf[352];  // the widest double printed in full
  snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

std::string format_percent(double share) {
  return format_fixed(share * 100, share < 0.1 ? 1 : 0) + "%";
}

std::string json_quote(const std::string& raw) { return to_json(Json(raw)); }

std::string to_json(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace rankscope
