#pragma once
// The one simulated clock of the tests: both readings are `now`, which the
// test moves by hand (style.md: one time source, one simulated clock).
// Tests that need a node whose clock is off wrap a clock in OffsetClock.
#include <cstdint>

#include "common/clock.h"

namespace rankscope::testing {

class ManualClock final : public Clock {
 public:
  explicit ManualClock(uint64_t start_ns = 1'800'000'000'000'000'000ull) : now(start_ns) {}
  uint64_t monotonic_ns() const override { return now; }
  uint64_t realtime_ns() const override { return now; }
  uint64_t now;
};

// A node clock with no offset, for a Summariser under test (it shifts BPF
// timestamps through the node's clock).
inline const OffsetClock& unshifted_node_clock() {
  static const SystemClock system;
  static const OffsetClock clock(system, 0);
  return clock;
}

}  // namespace rankscope::testing
