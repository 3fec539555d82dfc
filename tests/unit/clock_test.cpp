// Offset and drift estimation from NTP-style probes with asymmetric,
// heavy-tailed queueing delay, as on a busy network.
#include "collector/model/clock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

namespace rankscope::collector {
namespace {

// A node whose clock runs `drift_ppm` fast and is `offset_ns` behind the
// collector at node time 0; probes once a second with exponential one-way
// delays of mean `jitter_ns` on top of 50 us.
struct SimulatedNode {
  int64_t offset_ns;
  double drift_ppm;
  double jitter_ns;
  std::mt19937_64 rng{42};

  // Collector time at node time t.
  uint64_t collector_at(uint64_t node_ns) const {
    return static_cast<uint64_t>(static_cast<int64_t>(node_ns) + offset_ns -
                                 static_cast<int64_t>(static_cast<double>(node_ns) * drift_ppm * 1e-6));
  }
  ClockProbeSample probe(uint64_t t1) {
    std::exponential_distribution<double> delay(1.0 / jitter_ns);
    uint64_t there = 50'000 + static_cast<uint64_t>(delay(rng));
    uint64_t back = 50'000 + static_cast<uint64_t>(delay(rng));
    uint64_t t2 = collector_at(t1 + there);
    uint64_t t3 = t2 + 20'000;
    uint64_t t4 = t1 + there + 20'000 + back;
    return {t1, t2, t3, t4};
  }
};

TEST(NodeClock, RecoversOffsetFromFewProbes) {
  SimulatedNode node{250'000'000, 0, 2'000'000};
  NodeClock clock;
  for (int i = 0; i < 8; ++i) clock.add(node.probe(1'000'000'000ull + i * 1'000'000'000ull));
  uint64_t t = 9'000'000'000ull;
  double error = static_cast<double>(clock.to_cluster(t)) - static_cast<double>(node.collector_at(t));
  EXPECT_LT(std::abs(error), 1'000'000.0);
  EXPECT_LE(std::abs(error), static_cast<double>(clock.uncertainty_ns()));
}

TEST(NodeClock, AnEstimateATighterProbeReplacedStillCountsForAWhile) {
  // The first probe of a busy start: a 600 ms round trip, so the offset is
  // known within 300 ms. The next is tight. Records put on the cluster
  // clock in between carry up to 300 ms of error: whoever scores them within
  // the next seconds must count it, though the clock is tight now.
  NodeClock clock;
  const uint64_t s = 1'000'000'000ull;
  clock.add({100 * s, 1000 * s + 300'000'000, 1000 * s + 300'000'000, 100 * s + 600'000'000});
  EXPECT_EQ(clock.uncertainty_ns(), 300'000'000u);
  clock.add({101 * s, 1001 * s, 1001 * s, 101 * s + 100'000});
  EXPECT_EQ(clock.uncertainty_ns(), 50'000u);
  EXPECT_EQ(clock.uncertainty_since(995 * s), 300'000'000u) << "replaced at 1001 s: records converted before may still be scored";
  EXPECT_EQ(clock.uncertainty_since(1002 * s), 50'000u) << "nothing was converted with it since";
}

TEST(NodeClock, RecoversDriftOfThirtyPpmWithinFiftyMicroseconds) {
  // 1 ms of probe jitter, 30 us/s of drift, five minutes of probes.
  SimulatedNode node{-3'000'000'000ll, 30.0, 1'000'000};
  NodeClock clock;
  uint64_t t = 5'000'000'000ull;
  std::vector<uint64_t> halves;
  for (int i = 0; i < 300; ++i, t += 1'000'000'000ull) {
    ClockProbeSample probe = node.probe(t);
    halves.push_back(((probe.t4 - probe.t1) - (probe.t3 - probe.t2)) / 2);
    clock.add(probe);
  }
  EXPECT_NEAR(clock.drift_ppb() / 1000.0, -30.0, 3.0);
  for (uint64_t at : std::initializer_list<uint64_t>{t - 60000000000ull, t, t + 5000000000ull}) {
    double error = static_cast<double>(clock.to_cluster(at)) - static_cast<double>(node.collector_at(at));
    EXPECT_LT(std::abs(error), 50'000.0) << "at node time " << at;
    EXPECT_LE(std::abs(error), static_cast<double>(clock.uncertainty_ns())) << "at node time " << at;
  }
  // The fit's bound is a bound, so wider than the error, and still at least
  // twice as tight as what a typical probe alone says.
  std::nth_element(halves.begin(), halves.begin() + halves.size() / 2, halves.end());
  EXPECT_LT(clock.uncertainty_ns(), halves[halves.size() / 2] / 2);
}

TEST(NodeClock, DelaysAllOnTheWayInStayWithinTheReportedBound) {
  // A busy collector reads a probe late and stamps t2 then: every probe's
  // queueing falls on the way in, so the errors of the points a drift is
  // fitted through do not cancel, and the line through them (extrapolated
  // to the newest) can be off by more than the tightest probe's half round
  // trip. Whatever the fit, the stated bound holds the true error.
  for (uint64_t seed : {1ull, 2ull, 3ull, 4ull, 5ull}) {
    SimulatedNode node{-1'500'000'000ll, 30.0, 1'000'000};
    node.rng.seed(seed);
    std::exponential_distribution<double> delay(1.0 / 1'000'000);
    NodeClock clock;
    uint64_t t = 3'000'000'000ull;
    double worst_over_bound = 0;
    for (int i = 0; i < 120; ++i, t += 1'000'000'000ull) {
      uint64_t there = 50'000 + static_cast<uint64_t>(delay(node.rng));
      uint64_t t2 = node.collector_at(t + there);
      clock.add({t, t2, t2 + 20'000, t + there + 20'000 + 50'000});
      double error = static_cast<double>(clock.to_cluster(t)) - static_cast<double>(node.collector_at(t));
      worst_over_bound = std::max(worst_over_bound, std::abs(error) / static_cast<double>(clock.uncertainty_ns()));
    }
    EXPECT_LE(worst_over_bound, 1.0) << "seed " << seed;
  }
}

TEST(NodeClock, ARefinementAgainstTheTruthStaysWithinTheReportedBound) {
  // The refiner may move the estimate anywhere inside the probes' bound,
  // also the wrong way (wait ends stamped late on a loaded host): the
  // reported bound must still hold the true error.
  SimulatedNode node{250'000'000, 0, 2'000'000};
  NodeClock clock;
  for (int i = 0; i < 8; ++i) clock.add(node.probe(1'000'000'000ull + i * 1'000'000'000ull));
  uint64_t t = 9'000'000'000ull;
  double probe_error = static_cast<double>(clock.to_cluster(t)) - static_cast<double>(node.collector_at(t));
  int64_t probe_bound = static_cast<int64_t>(clock.probe_uncertainty_ns());
  clock.set_refinement(probe_error >= 0 ? probe_bound : -probe_bound, t);  // away from the truth
  double error = static_cast<double>(clock.to_cluster(t)) - static_cast<double>(node.collector_at(t));
  EXPECT_GT(std::abs(error), static_cast<double>(probe_bound)) << "the probes' bound alone no longer holds";
  EXPECT_LE(std::abs(error), static_cast<double>(clock.uncertainty_ns()));
  EXPECT_EQ(clock.uncertainty_ns(), clock.probe_uncertainty_ns() + static_cast<uint64_t>(probe_bound));
  NodeClock unknown;
  unknown.set_refinement(-5, t);
  EXPECT_EQ(unknown.uncertainty_ns(), UINT64_MAX) << "an unknown clock stays unknown, without overflow";
}

TEST(NodeClock, HowFarTheEstimateMovedIsTheSumOfItsStepsSinceATime) {
  // Ranks of one node share its clock: against each other, two of its
  // records are off only by the steps its estimate took between their
  // conversions (new probes, refinements), whatever its error against
  // the collector's clock.
  SimulatedNode node{250'000'000, 20.0, 2'000'000};
  NodeClock clock;
  clock.seed(1'000'000'000ull, 1'000'000'000ull + 251'000'000);  // 1 ms off
  std::vector<std::pair<uint64_t, uint64_t>> steps;              // (collector time, |step|), measured here
  for (int i = 0; i < 12; ++i) {
    ClockProbeSample s = node.probe(2'000'000'000ull + i * 1'000'000'000ull);
    const double before = static_cast<double>(clock.to_cluster(s.t4));
    clock.add(s);
    steps.emplace_back(s.t3, static_cast<uint64_t>(std::llabs(static_cast<int64_t>(
                                 std::llround(static_cast<double>(clock.to_cluster(s.t4)) - before)))));
  }
  EXPECT_GT(steps[0].second, 500'000u) << "the first probe moves the seed by about its 1 ms error";
  for (size_t from = 0; from < steps.size(); from += 5) {
    uint64_t sum = 0;
    for (size_t i = from; i < steps.size(); ++i) sum += steps[i].second;
    EXPECT_EQ(clock.moved_since(steps[from].first), sum) << "since probe " << from;
  }
  const uint64_t after = steps.back().first + 1;
  EXPECT_EQ(clock.moved_since(after), 0u) << "no step since: same-node records agree exactly";
  EXPECT_LT(clock.moved_since(after), clock.uncertainty_ns());
  clock.set_refinement(-30'000, after + 10);
  clock.set_refinement(-10'000, after + 20);
  EXPECT_EQ(clock.moved_since(after), 50'000u) << "a refinement moves the estimate too";
  EXPECT_EQ(clock.moved_since(after + 15), 20'000u);
  EXPECT_EQ(clock.moved_since(after + 21), 0u);
}

TEST(NodeClock, InconsistentSamplesAreIgnoredAndSeedIsUncertain) {
  NodeClock clock;
  clock.seed(1'000, 2'000'000);
  EXPECT_TRUE(clock.known());
  EXPECT_EQ(clock.offset_ns(), 2'000'000 - 1'000);
  EXPECT_GE(clock.uncertainty_ns(), 1'000'000'000u);
  clock.add({100, 50, 40, 200});  // t3 < t2
  clock.add({100, 50, 60, 90});   // t4 < t1
  EXPECT_EQ(clock.samples(), 0u);
  EXPECT_EQ(clock.to_cluster(1'000), 2'000'000u);
}

}  // namespace
}  // namespace rankscope::collector
