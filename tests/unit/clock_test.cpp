// Offset estimation from NTP-style probes with asymmetric noise.
#include <gtest/gtest.h>

#include <random>

#include "collector/clock.h"

namespace rankscope::collector {
namespace {

TEST(NodeClock, MinimumRoundTripProbeGivesTheOffset) {
  const int64_t true_offset = 250'000'000;  // the node is 250 ms behind the collector
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> queueing(1.0 / 2'000'000);  // mean 2 ms one-way extra delay
  NodeClock clock;
  uint64_t node_now = 5'000'000'000ull;
  for (int i = 0; i < 64; ++i) {
    uint64_t t1 = node_now;
    uint64_t there = 50'000 + static_cast<uint64_t>(queueing(rng));
    uint64_t back = 50'000 + static_cast<uint64_t>(queueing(rng));
    uint64_t t2 = t1 + true_offset + there;
    uint64_t t3 = t2 + 10'000;
    uint64_t t4 = t3 - true_offset + back;
    clock.add({t1, t2, t3, t4});
    node_now += 1'000'000'000ull;
  }
  EXPECT_NEAR(static_cast<double>(clock.offset_ns()), static_cast<double>(true_offset), 1'000'000.0);
  EXPECT_LT(clock.uncertainty_ns(), 1'000'000u);
  EXPECT_LE(std::abs(clock.offset_ns() - true_offset), static_cast<int64_t>(clock.uncertainty_ns()));
  EXPECT_EQ(clock.to_cluster(100), 100 + static_cast<uint64_t>(clock.offset_ns()));
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
}

}  // namespace
}  // namespace rankscope::collector
