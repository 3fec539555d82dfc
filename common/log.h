#pragma once
// One logging channel for every rankscope program.
//
// Levels and what they mean (an operator reads these at 3 a.m.):
//   error: something the user must act on; data may be lost or a feature is off.
//   warn:  something degraded or suspicious that the program worked around.
//   info:  a state change worth a line: started, connected, attached, stopped.
//   debug: detail for developers; off by default, may be frequent.
// The level is checked before any formatting is done (RS_LOG).
#include <cstdarg>
#include <optional>
#include <string_view>

namespace rankscope::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

Level level();
void set_level(Level level);
// Parses "error|warn|info|debug"; nothing for anything else.
std::optional<Level> parse_level(std::string_view name);
// Sets the level named "error|warn|info|debug"; returns false on anything else.
bool set_level(std::string_view name);
// Prefix printed before each line, e.g. the program name.
void set_program(std::string_view name);
void write(Level level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace rankscope::log

#define RS_LOG(lvl, ...)                                                          \
  do {                                                                            \
    if (::rankscope::log::Level::lvl <= ::rankscope::log::level())                \
      ::rankscope::log::write(::rankscope::log::Level::lvl, __VA_ARGS__);         \
  } while (0)
