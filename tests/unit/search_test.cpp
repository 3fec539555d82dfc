// common/search.h: partition_from answers as std::partition_point does,
// from any guess, and reads only near the guess when the answer is there.
#include "common/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace rankscope {
namespace {

TEST(PartitionFrom, AnswersAsPartitionPointFromAnyGuess) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 2000; ++round) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 70)(rng);
    std::vector<uint64_t> sorted(size);
    for (auto& v : sorted) v = std::uniform_int_distribution<uint64_t>(0, 40)(rng);
    std::sort(sorted.begin(), sorted.end());
    const uint64_t t = std::uniform_int_distribution<uint64_t>(0, 42)(rng);
    const size_t expected =
        static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), t) - sorted.begin());
    for (size_t guess : {size_t{0}, size / 2, size, size + 5, std::uniform_int_distribution<size_t>(0, size)(rng)})
      ASSERT_EQ(partition_from(size, guess, [&](size_t i) { return sorted[i] < t; }), expected)
          << "size " << size << ", t " << t << ", guess " << guess;
  }
}

TEST(PartitionFrom, ReadsOnlyNearTheGuessWhenTheAnswerIsThere) {
  std::vector<uint64_t> sorted(1024);
  for (size_t i = 0; i < sorted.size(); ++i) sorted[i] = 10 * i;
  size_t lowest = sorted.size(), highest = 0, reads = 0;
  auto before = [&](size_t i) {
    lowest = std::min(lowest, i), highest = std::max(highest, i), ++reads;
    return sorted[i] < 5005;  // the answer: 501
  };
  EXPECT_EQ(partition_from(sorted.size(), 499, before), 501u);
  EXPECT_GE(lowest, 499u);
  EXPECT_LE(highest, 503u);
  EXPECT_LE(reads, 4u);
  // From far off it still finds it, by doubling steps and halves.
  reads = 0;
  EXPECT_EQ(partition_from(sorted.size(), 0, before), 501u);
  EXPECT_LE(reads, 21u);
}

}  // namespace
}  // namespace rankscope
