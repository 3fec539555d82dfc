#pragma once
// A rate limit: two token buckets (messages and bytes) per id (the caller's
// choice: the collector gives a connection's CurveZMQ key, so that a key
// opening many connections shares one budget), refilled at the configured rates with a burst of one
// second's worth. A message over either budget is dropped before it is
// decoded, so a flooding peer costs the collector a map lookup per message
// and never delays the others (ROUTER sockets queue and fair-queue per
// connection, so its backlog stays in its own pipe). Time comes from the
// caller (no clock read here): tests drive it with made-up times.
#include <cstdint>
#include <string>
#include <unordered_map>

namespace rankscope::collector {

class RateLimiter {
 public:
  // 0 for either rate: that budget is unlimited.
  RateLimiter(uint32_t messages_per_s, uint64_t bytes_per_s)
      : messages_per_s_(messages_per_s), bytes_per_s_(bytes_per_s) {}
  bool enabled() const { return messages_per_s_ != 0 || bytes_per_s_ != 0; }
  // Whether a message of `bytes` from connection `id` at `now_ns` (monotonic) may pass.
  bool admit(const std::string& id, uint64_t bytes, uint64_t now_ns);
  size_t connections() const { return buckets_.size(); }

 private:
  struct Bucket {
    double messages = 0, bytes = 0;  // tokens left
    uint64_t refilled_ns = 0;
  };
  // Connections not heard from for this long are forgotten (routing ids of closed connections).
  static constexpr uint64_t kIdleNs = 60'000'000'000ull;
  void forget_idle(uint64_t now_ns);

  uint32_t messages_per_s_;
  uint64_t bytes_per_s_;
  std::unordered_map<std::string, Bucket> buckets_;
  uint64_t swept_ns_ = 0;
};

}  // namespace rankscope::collector
