#include "collector/clock.h"

namespace rankscope::collector {

void NodeClock::seed(uint64_t node_monotonic_ns, uint64_t node_realtime_ns) {
  if (!window_.empty()) return;  // probes already say more
  offset_ns_ = static_cast<int64_t>(node_realtime_ns - node_monotonic_ns);
  uncertainty_ns_ = 1'000'000'000ull;
  known_ = true;
}

void NodeClock::add(const ClockProbeSample& s) {
  if (s.t4 < s.t1 || s.t3 < s.t2) return;
  window_.push_back(s);
  if (window_.size() > kWindow) window_.pop_front();
  const ClockProbeSample* best = nullptr;
  uint64_t best_rtt = UINT64_MAX;
  for (const auto& sample : window_) {
    // Round trip minus the collector's own turnaround.
    uint64_t rtt = (sample.t4 - sample.t1) - (sample.t3 - sample.t2);
    if (rtt < best_rtt) {
      best_rtt = rtt;
      best = &sample;
    }
  }
  // offset = ((t2 - t1) + (t3 - t4)) / 2, in signed arithmetic.
  int64_t a = static_cast<int64_t>(best->t2 - best->t1);
  int64_t b = static_cast<int64_t>(best->t3 - best->t4);
  offset_ns_ = a / 2 + b / 2 + ((a % 2) + (b % 2)) / 2;
  uncertainty_ns_ = best_rtt / 2;
  known_ = true;
}

}  // namespace rankscope::collector
