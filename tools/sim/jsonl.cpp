#include "tools/sim/jsonl.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/format.h"

namespace rankscope::sim {

namespace {
struct Parser {
  const std::string& s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  std::optional<std::string> string() {
    ws();
    if (i >= s.size() || s[i] != '"') return std::nullopt;
    ++i;
    std::string out;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\' && i < s.size()) {
        char e = s[i++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'u':
            if (i + 4 <= s.size()) {
              unsigned code = static_cast<unsigned>(std::strtoul(s.substr(i, 4).c_str(), nullptr, 16));
              i += 4;
              if (code < 0x80) out += static_cast<char>(code);
              else if (code < 0x800) {
                out += static_cast<char>(0xc0 | (code >> 6));
                out += static_cast<char>(0x80 | (code & 0x3f));
              } else {
                out += static_cast<char>(0xe0 | (code >> 12));
                out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
                out += static_cast<char>(0x80 | (code & 0x3f));
              }
            }
            break;
          default: out += e;
        }
      } else {
        out += c;
      }
    }
    if (i >= s.size()) return std::nullopt;
    ++i;
    return out;
  }
  std::optional<JsonValue> value() {
    ws();
    JsonValue v;
    if (i >= s.size()) return std::nullopt;
    if (s[i] == '"') {
      auto str = string();
      if (!str) return std::nullopt;
      v.kind = JsonValue::string;
      v.str = *str;
    } else if (s[i] == '[') {
      ++i;
      v.kind = JsonValue::array;
      if (eat(']')) return v;
      do {
        auto item = value();
        if (!item) return std::nullopt;
        v.items.push_back(*item);
      } while (eat(','));
      if (!eat(']')) return std::nullopt;
    } else if (s.compare(i, 4, "true") == 0) {
      i += 4;
      v.kind = JsonValue::boolean;
      v.flag = true;
    } else if (s.compare(i, 5, "false") == 0) {
      i += 5;
      v.kind = JsonValue::boolean;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else {
      char* end = nullptr;
      v.num = std::strtod(s.c_str() + i, &end);
      if (end == s.c_str() + i) return std::nullopt;
      i = static_cast<size_t>(end - s.c_str());
      v.kind = JsonValue::number;
    }
    return v;
  }
};
}  // namespace

double JsonObject::num(const std::string& key, double fallback) const {
  auto it = fields_.find(key);
  return it == fields_.end() || it->second.kind != JsonValue::number ? fallback : it->second.num;
}
int64_t JsonObject::i64(const std::string& key, int64_t fallback) const {
  auto it = fields_.find(key);
  if (it == fields_.end()) return fallback;
  if (it->second.kind == JsonValue::string) return std::strtoll(it->second.str.c_str(), nullptr, 10);
  return it->second.kind == JsonValue::number ? static_cast<int64_t>(std::llround(it->second.num)) : fallback;
}
std::string JsonObject::str(const std::string& key) const {
  auto it = fields_.find(key);
  return it == fields_.end() ? std::string() : it->second.str;
}
bool JsonObject::flag(const std::string& key) const {
  auto it = fields_.find(key);
  return it != fields_.end() && it->second.flag;
}
std::vector<double> JsonObject::nums(const std::string& key) const {
  std::vector<double> out;
  auto it = fields_.find(key);
  if (it != fields_.end())
    for (const auto& v : it->second.items) out.push_back(v.num);
  return out;
}
std::vector<std::string> JsonObject::strs(const std::string& key) const {
  std::vector<std::string> out;
  auto it = fields_.find(key);
  if (it != fields_.end())
    for (const auto& v : it->second.items) out.push_back(v.str);
  return out;
}

Result<JsonObject> parse_json_object(const std::string& line) {
  Parser p{line};
  JsonObject obj;
  if (!p.eat('{')) return make_error(Errc::invalid_argument, "not a JSON object: " + line.substr(0, 60));
  if (p.eat('}')) return obj;
  do {
    auto key = p.string();
    if (!key || !p.eat(':')) return make_error(Errc::invalid_argument, "bad JSON key in: " + line.substr(0, 60));
    auto value = p.value();
    if (!value) return make_error(Errc::invalid_argument, "bad JSON value for " + *key);
    obj.fields()[*key] = *value;
  } while (p.eat(','));
  if (!p.eat('}')) return make_error(Errc::invalid_argument, "unterminated JSON object: " + line.substr(0, 60));
  return obj;
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

void JsonLine::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += json_quote(k) + ":";
}
JsonLine& JsonLine::add(const std::string& k, const std::string& value) {
  key(k);
  body_ += json_quote(value);
  return *this;
}
JsonLine& JsonLine::add(const std::string& k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";
    return *this;
  }
  char buf[64];
  snprintf(buf, sizeof(buf), "%.9g", value);
  body_ += buf;
  return *this;
}
JsonLine& JsonLine::add(const std::string& k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}
JsonLine& JsonLine::add(const std::string& k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}
JsonLine& JsonLine::add(const std::string& k, const std::vector<int64_t>& values) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < values.size(); ++i) body_ += (i ? "," : "") + std::to_string(values[i]);
  body_ += "]";
  return *this;
}
JsonLine& JsonLine::add(const std::string& k, const std::vector<std::string>& values) {
  key(k);
  body_ += "[";
  for (size_t i = 0; i < values.size(); ++i) body_ += (i ? "," : "") + json_quote(values[i]);
  body_ += "]";
  return *this;
}
JsonLine& JsonLine::null(const std::string& k) {
  key(k);
  body_ += "null";
  return *this;
}

}  // namespace rankscope::sim
