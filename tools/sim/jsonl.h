#pragma once
// The flat JSON objects rankscope-sim writes (truth and scores, one per
// line) and reads back: string, number, bool and null values, and arrays of
// them. Not a general JSON library: it reads what it writes.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace rankscope::sim {

struct JsonValue {
  enum Kind { null, number, string, boolean, array } kind = null;
  double num = 0;
  std::string str;
  bool flag = false;
  std::vector<JsonValue> items;
};

class JsonObject {
 public:
  bool has(const std::string& key) const { return fields_.count(key) > 0; }
  double num(const std::string& key, double fallback = 0) const;
  int64_t i64(const std::string& key, int64_t fallback = 0) const;
  std::string str(const std::string& key) const;
  bool flag(const std::string& key) const;
  std::vector<double> nums(const std::string& key) const;
  std::vector<std::string> strs(const std::string& key) const;
  std::map<std::string, JsonValue>& fields() { return fields_; }
  const std::map<std::string, JsonValue>& fields() const { return fields_; }

 private:
  std::map<std::string, JsonValue> fields_;
};

Result<JsonObject> parse_json_object(const std::string& line);
Result<std::vector<JsonObject>> read_json_lines(const std::string& path);

// Builds one line: {"k":v,...}.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonLine& add(const std::string& key, double value);
  JsonLine& add(const std::string& key, int64_t value);
  JsonLine& add(const std::string& key, uint64_t value) { return add(key, static_cast<int64_t>(value)); }
  JsonLine& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonLine& add(const std::string& key, bool value);
  JsonLine& add(const std::string& key, const std::vector<int64_t>& values);
  JsonLine& add(const std::string& key, const std::vector<std::string>& values);
  JsonLine& null(const std::string& key);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

}  // namespace rankscope::sim
