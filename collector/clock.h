#pragma once
// One node's clock against the collector's: cluster_ns = node_ns + offset.
// Estimated from NTP-style probes (t1, t4 on the node's clock; t2, t3 on
// the collector's): each probe bounds the offset within half its round trip,
// so the probe with the smallest round trip in a recent window is trusted.
#include <cstddef>
#include <cstdint>
#include <deque>

namespace rankscope::collector {

struct ClockProbeSample {
  uint64_t t1, t2, t3, t4;
};

class NodeClock {
 public:
  // The first, rough estimate from the Hello's (monotonic, realtime) pair:
  // only as good as the node's own wall clock.
  void seed(uint64_t node_monotonic_ns, uint64_t node_realtime_ns);
  // Ignores samples that are inconsistent (t4 < t1 or t3 < t2).
  void add(const ClockProbeSample& sample);

  int64_t offset_ns() const { return offset_ns_; }
  // Half the round trip of the sample in use; the seed counts as 1 s.
  uint64_t uncertainty_ns() const { return uncertainty_ns_; }
  uint32_t samples() const { return static_cast<uint32_t>(window_.size()); }
  bool known() const { return known_; }
  uint64_t to_cluster(uint64_t node_ns) const { return node_ns + static_cast<uint64_t>(offset_ns_); }

 private:
  static constexpr size_t kWindow = 64;
  std::deque<ClockProbeSample> window_;
  int64_t offset_ns_ = 0;
  uint64_t uncertainty_ns_ = UINT64_MAX;
  bool known_ = false;
};

}  // namespace rankscope::collector
