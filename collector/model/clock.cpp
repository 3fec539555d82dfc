#include "collector/model/clock.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace rankscope::collector {

namespace {
uint64_t round_trip(const ClockProbeSample& s) {
  return (s.t4 - s.t1) - (s.t3 - s.t2);
}

// ((t2 - t1) + (t3 - t4)) / 2 without overflow, in signed arithmetic.
int64_t sample_offset(const ClockProbeSample& s) {
  int64_t a = static_cast<int64_t>(s.t2 - s.t1);
  int64_t b = static_cast<int64_t>(s.t3 - s.t4);
  return a / 2 + b / 2 + ((a % 2) + (b % 2)) / 2;
}

uint64_t midpoint(const ClockProbeSample& s) {
  return s.t1 + (s.t4 - s.t1) / 2;
}
}  // namespace

void NodeClock::restore(int64_t offset_ns, int64_t refinement_ns, double drift_ppb, uint64_t reference_ns,
                        uint64_t uncertainty_ns) {
  if (!window_.empty()) return;
  offset_ns_ = offset_ns - refinement_ns;
  refinement_ns_ = refinement_ns;
  drift_ = drift_ppb / 1e9;
  reference_ns_ = reference_ns;
  uncertainty_ns_ = uncertainty_ns;
  known_ = restored_ = true;
}

void NodeClock::seed(uint64_t node_monotonic_ns, uint64_t node_realtime_ns) {
  if (!window_.empty() || restored_) return;  // probes (or an earlier run's fit) already say more
  offset_ns_ = static_cast<int64_t>(node_realtime_ns - node_monotonic_ns);
  reference_ns_ = node_monotonic_ns;
  drift_ = 0;
  uncertainty_ns_ = 1'000'000'000ull;
  known_ = true;
}

void NodeClock::add(const ClockProbeSample& s) {
  if (s.t4 < s.t1 || s.t3 < s.t2 || (s.t4 - s.t1) < (s.t3 - s.t2)) return;
  window_.push_back(s);
  if (window_.size() > kWindow) window_.pop_front();
  const uint64_t before = known_ ? uncertainty_ns() : UINT64_MAX;
  const uint64_t was = known_ ? to_cluster(s.t4) : 0;
  fit();
  if (before != UINT64_MAX) {
    const uint64_t now = to_cluster(s.t4);
    note_step(s.t3, now > was ? now - was : was - now);
  }
  if (before != UINT64_MAX && before > uncertainty_ns()) {
    replaced_.emplace_back(s.t3, before);
    while (replaced_.size() > kReplaced || (!replaced_.empty() && replaced_.front().first + kReplacedNs < s.t3))
      replaced_.pop_front();
  }
  known_ = true;
}

void NodeClock::fit() {
  // One point per group: the probe with the smallest round trip.
  struct Point {
    double t, offset, weight;
    uint64_t half_rtt;
  };
  std::vector<Point> points;
  for (size_t start = 0; start < window_.size(); start += kGroup) {
    size_t end = std::min(window_.size(), start + kGroup);
    const ClockProbeSample* best = &window_[start];
    for (size_t i = start; i < end; ++i)
      if (round_trip(window_[i]) < round_trip(*best)) best = &window_[i];
    uint64_t half = round_trip(*best) / 2;
    double w = 1.0 / std::pow(static_cast<double>(half) + 1000.0, 2);
    points.push_back({static_cast<double>(midpoint(*best)), static_cast<double>(sample_offset(*best)), w, half});
  }
  const Point& newest = points.back();
  reference_ns_ = static_cast<uint64_t>(newest.t);
  uint64_t best_half = newest.half_rtt;
  for (const auto& p : points) best_half = std::min(best_half, p.half_rtt);

  double span = points.back().t - points.front().t;
  if (points.size() < 3 || span < 10e9) {
    // Too short to see drift: the tightest recent probe alone.
    auto tightest = std::min_element(points.begin(), points.end(),
                                     [](const Point& a, const Point& b) { return a.half_rtt < b.half_rtt; });
    offset_ns_ = static_cast<int64_t>(tightest->offset);
    drift_ = 0;
    uncertainty_ns_ = tightest->half_rtt;
    return;
  }
  // Weighted least squares of offset over time, centred for precision.
  double sw = 0, st = 0, so = 0;
  for (const auto& p : points) {
    sw += p.weight;
    st += p.weight * p.t;
    so += p.weight * p.offset;
  }
  double tm = st / sw, om = so / sw, stt = 0, sto = 0;
  for (const auto& p : points) {
    stt += p.weight * (p.t - tm) * (p.t - tm);
    sto += p.weight * (p.t - tm) * (p.offset - om);
  }
  drift_ = stt > 0 ? sto / stt : 0;
  double at_reference = om + drift_ * (static_cast<double>(reference_ns_) - tm);
  double residual = 0;
  for (const auto& p : points) {
    double predicted = om + drift_ * (p.t - tm);
    residual += p.weight * (p.offset - predicted) * (p.offset - predicted);
  }
  residual = std::sqrt(residual / sw);
  offset_ns_ = static_cast<int64_t>(std::llround(at_reference));
  uncertainty_ns_ = best_half + static_cast<uint64_t>(residual);
}

uint64_t NodeClock::uncertainty_since(uint64_t cluster_ns) const {
  uint64_t worst = uncertainty_ns();
  for (auto it = replaced_.rbegin(); it != replaced_.rend() && it->first >= cluster_ns; ++it)
    worst = std::max(worst, it->second);
  return worst;
}

void NodeClock::set_refinement(int64_t ns, uint64_t at_cluster_ns) {
  note_step(at_cluster_ns, static_cast<uint64_t>(ns > refinement_ns_ ? ns - refinement_ns_ : refinement_ns_ - ns));
  refinement_ns_ = ns;
}

void NodeClock::note_step(uint64_t at_cluster_ns, uint64_t moved_ns) {
  if (moved_ns == 0) return;
  // In time order: a step stamped before the last one (a probe that came
  // late) is taken as the last one's time, remembered longer, not shorter.
  if (!steps_.empty()) at_cluster_ns = std::max(at_cluster_ns, steps_.back().first);
  steps_.emplace_back(at_cluster_ns, moved_ns);
  while (steps_.size() > kSteps || steps_.front().first + kReplacedNs < at_cluster_ns) steps_.pop_front();
}

uint64_t NodeClock::moved_since(uint64_t cluster_ns) const {
  uint64_t moved = 0;
  for (auto it = steps_.rbegin(); it != steps_.rend() && it->first >= cluster_ns; ++it)
    moved = it->second > UINT64_MAX - moved ? UINT64_MAX : moved + it->second;
  return moved;
}

uint64_t NodeClock::to_cluster(uint64_t node_ns) const {
  double elapsed = static_cast<double>(static_cast<int64_t>(node_ns - reference_ns_));
  int64_t offset = offset_ns_ + refinement_ns_ + static_cast<int64_t>(std::llround(drift_ * elapsed));
  return node_ns + static_cast<uint64_t>(offset);
}

}  // namespace rankscope::collector
