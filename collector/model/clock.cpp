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
  // Every estimate here is of the offset at the newest probe (the
  // reference) and a linear combination of probe offsets. Each probe's
  // offset is within its half round trip of the truth, on a side nothing
  // tells: a busy collector stamps t2 late on every probe alike, so errors
  // need not cancel. A combination sum c_i * offset_i whose c_i sum to 1
  // and carry a steady drift to the reference (sum c_i * t_i = reference)
  // is therefore within sum |c_i| * half_i of the truth. The newest probe
  // alone is one such; each pair of points projected to the reference
  // another (a tight recent point carried forward by the slope to a far
  // one); the weighted line through all of them a third. The truth lies in
  // every one's interval, so in their intersection: the offset is taken
  // inside it and the uncertainty is its far edge from there. While the
  // probes span too little time for a slope, each point alone bounds the
  // offset too, by its half round trip and the most two clocks may drift
  // apart since.
  struct Point {
    double t, offset, weight, half;  // t and offset relative to the newest probe
  };
  const ClockProbeSample& last = window_.back();
  reference_ns_ = midpoint(last);
  const int64_t base = sample_offset(last);
  auto point = [&](const ClockProbeSample& s) {
    double half = static_cast<double>(round_trip(s) / 2);
    return Point{static_cast<double>(static_cast<int64_t>(midpoint(s) - reference_ns_)),
                 static_cast<double>(sample_offset(s) - base), 1.0 / std::pow(half + 1000.0, 2), half};
  };
  // One point per group: the probe with the smallest round trip.
  std::vector<Point> points;
  for (size_t start = 0; start < window_.size(); start += kGroup) {
    size_t end = std::min(window_.size(), start + kGroup);
    const ClockProbeSample* best = &window_[start];
    for (size_t i = start; i < end; ++i)
      if (round_trip(window_[i]) < round_trip(*best)) best = &window_[i];
    points.push_back(point(*best));
  }

  const Point newest = point(last);
  double lo = newest.offset - newest.half, hi = newest.offset + newest.half;
  auto within = [&](double x, double bound) {
    lo = std::max(lo, x - bound);
    hi = std::min(hi, x + bound);
  };
  std::vector<Point> candidates = points;
  if (points.back().t < newest.t) candidates.push_back(newest);
  for (size_t a = 0; a < candidates.size(); ++a)
    for (size_t b = a + 1; b < candidates.size(); ++b) {
      const Point &p = candidates[a], &q = candidates[b];
      if (q.t <= p.t) continue;
      double cq = (newest.t - p.t) / (q.t - p.t), cp = 1 - cq;
      within(cp * p.offset + cq * q.offset, std::fabs(cp) * p.half + std::fabs(cq) * q.half);
    }
  for (const auto& p : candidates) within(p.offset, p.half + kMaxDrift * std::fabs(p.t));
  const bool consistent = lo <= hi;  // else a rate that changed within the window

  double span = points.back().t - points.front().t;
  if (points.size() < 3 || span < 10e9) {
    // Too short to fit a drift: the middle of what the probes allow.
    double x = consistent ? (lo + hi) / 2 : newest.offset;
    offset_ns_ = base + static_cast<int64_t>(std::llround(x));
    drift_ = 0;
    uncertainty_ns_ = static_cast<uint64_t>(std::ceil(consistent ? (hi - lo) / 2 : newest.half));
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
  const double fitted = om + drift_ * (newest.t - tm);
  // Its own bound, and the residual: what covers a rate that changed within
  // the window (a slewing NTP daemon), where none of the bounds hold.
  double line_bound = 0, residual = 0;
  for (const auto& p : points) {
    double c = p.weight / sw + (stt > 0 ? (newest.t - tm) * p.weight * (p.t - tm) / stt : 0);
    line_bound += std::fabs(c) * p.half;
    double predicted = om + drift_ * (p.t - tm);
    residual += p.weight * (p.offset - predicted) * (p.offset - predicted);
  }
  residual = std::sqrt(residual / sw);
  within(fitted, line_bound);
  double x = fitted, bound = line_bound;
  if (lo <= hi) {
    x = std::clamp(fitted, lo, hi);  // the line, unless the probes rule it out
    bound = std::max(x - lo, hi - x);
  }
  offset_ns_ = base + static_cast<int64_t>(std::llround(x));
  uncertainty_ns_ = static_cast<uint64_t>(std::ceil(bound)) + static_cast<uint64_t>(residual);
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
