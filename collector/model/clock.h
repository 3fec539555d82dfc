#pragma once
// One node's clock against the collector's: cluster_ns = node_ns + offset(node_ns).
//
// Estimated from NTP-style probes (t1, t4 on the node's clock; t2, t3 on the
// collector's). A probe bounds the offset within half its round trip, so
// queueing delay only ever widens the bound: in each group of consecutive
// probes the one with the smallest round trip is trusted (the "minimum
// filter" of NTP and of Paxson's clock studies). A line through those
// points, weighted by how tight each is, gives the offset and the drift
// (monotonic clocks of two machines run apart by 10-30 us/s).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

namespace rankscope::collector {

struct ClockProbeSample {
  uint64_t t1, t2, t3, t4;
};

class NodeClock {
 public:
  // The first, rough estimate from the Hello's (monotonic, realtime) pair:
  // only as good as the node's own wall clock.
  void seed(uint64_t node_monotonic_ns, uint64_t node_realtime_ns);
  // The fit an earlier run of the collector stored (offset() and
  // refinement_ns() at node time reference_ns): kept until probes come in,
  // and preferred to the Hello's seed. Only valid while the node has not
  // rebooted (same boot id): the caller checks.
  void restore(int64_t offset_ns, int64_t refinement_ns, double drift_ppb, uint64_t reference_ns,
               uint64_t uncertainty_ns);
  // Ignores samples that are inconsistent (t4 < t1 or t3 < t2).
  void add(const ClockProbeSample& sample);

  // Offset at the newest probe (cluster minus node), refinement included.
  int64_t offset_ns() const { return offset_ns_ + refinement_ns_; }
  // Drift in ns per s of node time (ppm x 1000); 0 until enough probes span time.
  double drift_ppb() const { return drift_ * 1e9; }
  // What the probes alone bound: the far edge, from the estimate, of the
  // intersection of what the newest probe, each pair of points projected
  // to it, the fitted line and each point widened by kMaxDrift since allow
  // (fit()), plus the fit's residual once a line is fitted; the seed
  // counts as 1 s.
  uint64_t probe_uncertainty_ns() const { return uncertainty_ns_; }
  // The bound on offset_ns(): the probes put the true offset within
  // probe_uncertainty_ns() of their estimate, and the refinement moved the
  // estimate away from it by |refinement_ns()|.
  uint64_t uncertainty_ns() const {
    uint64_t moved = static_cast<uint64_t>(refinement_ns_ < 0 ? -refinement_ns_ : refinement_ns_);
    return uncertainty_ns_ > UINT64_MAX - moved ? UINT64_MAX : uncertainty_ns_ + moved;
  }
  // The largest uncertainty_ns() of the estimates in use since `cluster_ns`
  // (the collector's clock): records converted with an estimate a tighter
  // probe has since replaced carry that estimate's error still.
  uint64_t uncertainty_since(uint64_t cluster_ns) const;
  // How far the estimate moved since `cluster_ns`: the sum of its steps (a
  // new probe's fit, a refinement), each at the collector time it took
  // effect. Records of this node converted on either side of a step are
  // that far off against each other, and no further: its ranks share its
  // clock, whatever the estimate's error against the others'.
  uint64_t moved_since(uint64_t cluster_ns) const;
  uint32_t samples() const { return static_cast<uint32_t>(window_.size()); }
  bool known() const { return known_; }
  uint64_t to_cluster(uint64_t node_ns) const;
  // A correction from the collectives (collector/model/clock_refine.h), added
  // to the probes' offset from `at_cluster_ns` on (the collector's clock).
  void set_refinement(int64_t ns, uint64_t at_cluster_ns);
  int64_t refinement_ns() const { return refinement_ns_; }
  uint64_t reference_ns() const { return reference_ns_; }

 private:
  static constexpr size_t kWindow = 256;  // probes kept (about 4 minutes at one a second)
  static constexpr size_t kGroup = 8;     // probes per minimum-filter group
  // How fast two machines' clocks may run apart (ns per ns): crystals are
  // made within +-50 ppm; an NTP daemon slews faster only while it corrects
  // a step, and the fit's residual covers that.
  static constexpr double kMaxDrift = 100e-6;
  void fit();

  std::deque<ClockProbeSample> window_;
  // Estimates replaced lately: (collector time of the probe that replaced it, its uncertainty).
  static constexpr size_t kReplaced = 64;
  static constexpr uint64_t kReplacedNs = 60'000'000'000ull;
  std::deque<std::pair<uint64_t, uint64_t>> replaced_;
  // The estimate's steps lately: (collector time, how far it moved), in time order.
  static constexpr size_t kSteps = 256;
  std::deque<std::pair<uint64_t, uint64_t>> steps_;
  void note_step(uint64_t at_cluster_ns, uint64_t moved_ns);
  uint64_t reference_ns_ = 0;  // node time the offset refers to
  int64_t offset_ns_ = 0;
  double drift_ = 0;  // d(offset)/d(node time)
  uint64_t uncertainty_ns_ = UINT64_MAX;
  int64_t refinement_ns_ = 0;
  bool known_ = false;
  bool restored_ = false;
};

}  // namespace rankscope::collector
