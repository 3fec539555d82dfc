#pragma once
// A guard for text handed to Boost.Program_options (flags, config files).
//
// Boost (1.74, Debian 12) builds its error messages by replacing
// placeholders such as %canonical_option% or %value% with the offending
// text, in a loop that starts over after each replacement: text that itself
// holds the placeholder (`liveness-ms = %value%`) makes the error message,
// and so the program, loop forever. Found by tests/fuzz/config_fuzz.cpp.
// Such text is refused before Boost sees it.
#include <cctype>
#include <string>
#include <string_view>

#include "common/result.h"

namespace rankscope {

// Refuses `text` if it holds %word% (word: letters, digits, '_'); `where`
// names it in the error ("config file", "argument 3").
inline Result<void> check_no_placeholders(std::string_view text, const std::string& where) {
  for (size_t open = text.find('%'); open != std::string_view::npos; open = text.find('%', open + 1)) {
    size_t end = open + 1;
    while (end < text.size() && (isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) ++end;
    if (end > open + 1 && end < text.size() && text[end] == '%')
      return make_error(Errc::invalid_argument, where + ": '" + std::string(text.substr(open, end + 1 - open)) +
                                                    "' is not allowed (a %word% breaks the option parser's messages)");
  }
  return {};
}

}  // namespace rankscope
