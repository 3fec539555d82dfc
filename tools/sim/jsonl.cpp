#include "tools/sim/jsonl.h"

#include <cmath>
#include <cstdlib>
#include <fstream>

namespace rankscope::sim {

const Json* JsonObject::find(const std::string& key) const {
  auto it = value_.find(key);
  return it == value_.end() ? nullptr : &*it;
}

double JsonObject::num(const std::string& key, double fallback) const {
  const Json* v = find(key);
  return v && v->is_number() ? v->get<double>() : fallback;
}

int64_t JsonObject::i64(const std::string& key, int64_t fallback) const {
  const Json* v = find(key);
  if (!v) return fallback;
  if (v->is_string()) return std::strtoll(v->get_ref<const std::string&>().c_str(), nullptr, 10);
  if (v->is_number_integer()) return v->get<int64_t>();
  return v->is_number() ? static_cast<int64_t>(std::llround(v->get<double>())) : fallback;
}

std::string JsonObject::str(const std::string& key) const {
  const Json* v = find(key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

bool JsonObject::flag(const std::string& key) const {
  const Json* v = find(key);
  return v && v->is_boolean() && v->get<bool>();
}

std::vector<double> JsonObject::nums(const std::string& key) const {
  std::vector<double> out;
  if (const Json* v = find(key); v && v->is_array())
    for (const auto& item : *v) out.push_back(item.is_number() ? item.get<double>() : 0);
  return out;
}

std::vector<std::string> JsonObject::strs(const std::string& key) const {
  std::vector<std::string> out;
  if (const Json* v = find(key); v && v->is_array())
    for (const auto& item : *v) out.push_back(item.is_string() ? item.get<std::string>() : std::string());
  return out;
}

Result<JsonObject> parse_json_object(const std::string& line) {
  Json value = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return make_error(Errc::invalid_argument, "not JSON: " + line.substr(0, 60));
  if (!value.is_object()) return make_error(Errc::invalid_argument, "not a JSON object: " + line.substr(0, 60));
  return JsonObject(std::move(value));
}

Result<std::vector<JsonObject>> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(Errc::io, "cannot read " + path);
  std::vector<JsonObject> out;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    auto obj = parse_json_object(line);
    if (!obj) return make_error(Errc::invalid_argument, path + ":" + std::to_string(n) + ": " + obj.error().message);
    out.push_back(std::move(*obj));
  }
  return out;
}

JsonLine& JsonLine::add(const std::string& key, double value) {
  if (std::isfinite(value)) {
    value_[key] = value;
  } else {
    value_[key] = nullptr;
  }
  return *this;
}

}  // namespace rankscope::sim
