#include "collector/ingest/rate_limit.h"

#include <algorithm>

namespace rankscope::collector {

bool RateLimiter::admit(const std::string& id, uint64_t bytes, uint64_t now_ns) {
  if (!enabled()) return true;
  forget_idle(now_ns);
  // A new connection starts with a full bucket: one second's worth.
  auto [it, added] = buckets_.try_emplace(id, Bucket{double(messages_per_s_), double(bytes_per_s_), now_ns});
  Bucket& b = it->second;
  if (!added && now_ns > b.refilled_ns) {
    double seconds = static_cast<double>(now_ns - b.refilled_ns) / 1e9;
    b.messages = std::min<double>(messages_per_s_, b.messages + seconds * messages_per_s_);
    b.bytes =
        std::min<double>(static_cast<double>(bytes_per_s_), b.bytes + seconds * static_cast<double>(bytes_per_s_));
    b.refilled_ns = now_ns;
  }
  bool messages_ok = messages_per_s_ == 0 || b.messages >= 1;
  // A single message larger than a second's budget passes when the bucket
  // is full, or it could never pass at all.
  bool bytes_ok = bytes_per_s_ == 0 || b.bytes >= static_cast<double>(std::min<uint64_t>(bytes, bytes_per_s_));
  if (!messages_ok || !bytes_ok) return false;
  if (messages_per_s_) b.messages -= 1;
  if (bytes_per_s_) b.bytes -= static_cast<double>(bytes);
  return true;
}

void RateLimiter::forget_idle(uint64_t now_ns) {
  if (now_ns - swept_ns_ < kIdleNs) return;
  swept_ns_ = now_ns;
  std::erase_if(buckets_, [&](const auto& entry) { return now_ns - entry.second.refilled_ns > kIdleNs; });
}

}  // namespace rankscope::collector
