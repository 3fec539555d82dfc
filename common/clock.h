#pragma once
// Clocks are injected: code that needs the time takes a Clock, so tests can
// drive it (tests/support/manual_clock.h) and a node's clock can carry a
// test-only offset (OffsetClock).
#include <cstdint>
#include <ctime>

namespace rankscope {

class Clock {
 public:
  virtual ~Clock() = default;
  // CLOCK_MONOTONIC in ns: the clock BPF's bpf_ktime_get_ns() stamps events with.
  virtual uint64_t monotonic_ns() const = 0;
  // CLOCK_REALTIME in ns since the Unix epoch.
  virtual uint64_t realtime_ns() const = 0;
};

class SystemClock final : public Clock {
 public:
  uint64_t monotonic_ns() const override { return read(CLOCK_MONOTONIC); }
  uint64_t realtime_ns() const override { return read(CLOCK_REALTIME); }
  static uint64_t read(clockid_t id) {
    timespec ts{};
    clock_gettime(id, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }
};

// Another clock read `offset_ns` off: the agent's --test-clock-offset-ns
// plays a node whose clock is off by that much. Its readings and the BPF
// timestamps passed through shift() (taken on the base's CLOCK_MONOTONIC)
// stay on one node clock.
class OffsetClock final : public Clock {
 public:
  OffsetClock(const Clock& base, int64_t offset_ns) : base_(base), offset_(static_cast<uint64_t>(offset_ns)) {}
  uint64_t monotonic_ns() const override { return shift(base_.monotonic_ns()); }
  uint64_t realtime_ns() const override { return base_.realtime_ns() + offset_; }
  uint64_t shift(uint64_t base_monotonic_ns) const { return base_monotonic_ns + offset_; }

 private:
  const Clock& base_;
  uint64_t offset_;  // two's complement: adding it subtracts a negative offset
};

}  // namespace rankscope
