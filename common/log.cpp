#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

namespace rankscope::log {
namespace {
std::atomic<Level> g_level{Level::info};
std::string g_program = "rankscope";
std::mutex g_mutex;

const char* level_name(Level level) {
  switch (level) {
    case Level::error: return "error";
    case Level::warn: return "warn";
    case Level::info: return "info";
    case Level::debug: return "debug";
  }
  return "?";
}
}  // namespace

Level level() { return g_level.load(std::memory_order_relaxed); }
void set_level(Level level) { g_level.store(level, std::memory_order_relaxed); }

std::optional<Level> parse_level(std::string_view name) {
  for (Level l : {Level::error, Level::warn, Level::info, Level::debug})
    if (name == level_name(l)) return l;
  return std::nullopt;
}

bool set_level(std::string_view name) {
  auto parsed = parse_level(name);
  if (parsed) set_level(*parsed);
  return parsed.has_value();
}

void set_program(std::string_view name) { g_program = std::string(name); }

void write(Level level, const char* fmt, ...) {
  char message[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm parts{};
  gmtime_r(&now.tv_sec, &parts);
  std::lock_guard lock(g_mutex);
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: %s\n", parts.tm_year + 1900, parts.tm_mon + 1,
          parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec, now.tv_nsec / 1000000, g_program.c_str(),
          level_name(level), message);
}

}  // namespace rankscope::log
