#pragma once
// The byte helpers of the collector's own storage encodings (the timeline's
// keys and record values, the usage ledger's rows): big-endian where byte
// order must follow numeric order (keys), little-endian for fixed values.
#include <cstdint>
#include <string>

namespace rankscope::collector::bytes {

inline void put_be(std::string& out, uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
inline uint64_t get_be(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | static_cast<uint8_t>(in[i]);
  return value;
}
inline void put_le(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
inline uint64_t get_le(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(in[i]);
  return value;
}

}  // namespace rankscope::collector::bytes
