#pragma once
// The flat JSON objects rankscope-sim writes (truth and scores, one per
// line) and reads back, over the project's one JSON library (common/json.h).
#include <cstdint>
#include <string>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace rankscope::sim {

// One object read back; a missing key, or one of another type, reads as the fallback.
class JsonObject {
 public:
  explicit JsonObject(Json value = Json::object()) : value_(std::move(value)) {}
  bool has(const std::string& key) const { return value_.contains(key); }
  bool has_number(const std::string& key) const { return value_.contains(key) && value_.at(key).is_number(); }
  double num(const std::string& key, double fallback = 0) const;
  int64_t i64(const std::string& key, int64_t fallback = 0) const;  // a number, or a string of one
  std::string str(const std::string& key) const;
  bool flag(const std::string& key) const;
  std::vector<double> nums(const std::string& key) const;
  std::vector<std::string> strs(const std::string& key) const;

 private:
  const Json* find(const std::string& key) const;
  Json value_;
};

Result<JsonObject> parse_json_object(const std::string& line);
Result<std::vector<JsonObject>> read_json_lines(const std::string& path);

// Builds one line: {"k":v,...}.
class JsonLine {
 public:
  template <typename T>
  JsonLine& add(const std::string& key, const T& value) {
    value_[key] = value;
    return *this;
  }
  JsonLine& add(const std::string& key, double value);  // not finite: null
  JsonLine& null(const std::string& key) {
    value_[key] = nullptr;
    return *this;
  }
  std::string str() const { return to_json(value_); }

 private:
  Json value_ = Json::object();
};

}  // namespace rankscope::sim
