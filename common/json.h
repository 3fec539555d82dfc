#pragma once
// rankscope's one JSON writer: nlohmann-json with keys in the order they are
// set, written compact, invalid UTF-8 replaced by U+FFFD (the strings come
// from nodes and jobs, in their users' words).
#include <nlohmann/json.hpp>
#include <string>

namespace rankscope {

using Json = nlohmann::ordered_json;

std::string to_json(const Json& value);

}  // namespace rankscope
