#pragma once
// Clocks are injected: code that needs the time takes a Clock, so tests can
// drive it and a node's clock can carry a test-only offset.
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

}  // namespace rankscope
