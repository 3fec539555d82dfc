// Slow links from NCCL's proxy steps (collector/detect/link.h), fed through
// the GPU matcher as the ingest feeds it: a model built by hand, no store,
// no wire messages.
#include "collector/detect/link.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "collector/detect/findings.h"
#include "collector/match/gpu_matcher.h"
#include "collector/model/cluster.h"
#include "proto/records.h"
#include "tests/support/model.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kMs = 1'000'000ull;
constexpr uint64_t kComm = 0x5eed0000c0ffee22ull;
constexpr int32_t kRanks = 8;

// An 8-rank ring (rank r sends to r + 1), one AllReduce every 20 ms. A
// healthy link's transfers wait on the network about 1.2 ms per collective,
// spread as measured with NCCL on an H100 (docs/benchmarks.md): most within
// a millisecond of it, about 3 in 100 of the slowest 2-4 ms beyond.
class SlowLinkTest : public ::testing::Test {
 protected:
  SlowLinkTest() {
    testing::add_comm(model, kComm, kRanks, "job-1");
    matcher.subscribe(detector);
  }

  // Collective #seq; `wait(rank)` gives each rank's send-link wait, or
  // nullopt for a rank with no proxy steps.
  void collective(uint64_t seq, const std::function<std::optional<uint64_t>(int32_t)>& wait) {
    const CommState& comm = model.comms.at(kComm);
    const uint64_t t = 1'000'000 * kMs + seq * 20 * kMs;
    for (int32_t r = 0; r < kRanks; ++r) {
      proto::GpuRecord g{seq, 1u << 20, t, t + kMs, t + 5 * kMs};
      if (auto w = wait(r)) {
        g.link_peer = (r + 1) % kRanks;
        g.link_wait_ns = *w;
      }
      matcher.on_gpu(comm, r, RS_OP_ALLREDUCE, g);
    }
    now = t + 6 * kMs;
  }
  uint64_t healthy() {
    std::lognormal_distribution<double> base(std::log(1.2e6), 0.3);
    std::uniform_real_distribution<double> spike(2e6, 4e6);
    double w = base(random);
    if (std::uniform_real_distribution<double>(0, 1)(random) < 0.03) w += spike(random);
    return static_cast<uint64_t>(w);
  }
  std::vector<const Finding*> links() const {
    std::vector<const Finding*> out;
    for (const Finding* f : book.open())
      if (f->kind == FindingKind::slow_link) out.push_back(f);
    return out;
  }
  // `count` collectives, evaluated after each 10 (as the collector's loop would).
  void run(uint64_t& seq, int count, const std::function<std::optional<uint64_t>(int32_t)>& wait) {
    for (int i = 0; i < count; ++i) {
      collective(seq++, wait);
      if (i % 10 == 9) detector.evaluate(now);
    }
  }

  ClusterModel model;
  GpuMatcher matcher;
  FindingBook book;
  LinkDetector detector{model, book};
  std::mt19937_64 random{7};
  uint64_t now = 0;
};

TEST_F(SlowLinkTest, ALinkWhoseTransfersWaitFarLongerIsNamedAndResolvedWhenItHeals) {
  uint64_t seq = 0;
  run(seq, 2000, [&](int32_t) { return healthy(); });
  EXPECT_TRUE(links().empty()) << "healthy links, spikes and all, are not slow";

  // Rank 5's link to rank 6 takes 14x as long (a port trained down).
  run(seq, 40, [&](int32_t r) { return r == 5 ? healthy() * 14 : healthy(); });
  auto open = links();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0]->ranks, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(open[0]->nodes, (std::vector<std::string>{"node-2", "node-3"}));
  EXPECT_NE(open[0]->summary.find("rank 5 on node-2 -> rank 6 on node-3"), std::string::npos) << open[0]->summary;
  EXPECT_NE(open[0]->summary.find("link side"), std::string::npos) << open[0]->summary;
  EXPECT_GT(open[0]->lateness_s, 0.010);
  EXPECT_GT(open[0]->wait_share, 0.5) << "the link's excess beside the collectives' 4 ms kernels";
  const uint64_t id = open[0]->id;

  run(seq, 200, [&](int32_t r) { return r == 5 ? healthy() * 14 : healthy(); });
  ASSERT_EQ(links().size(), 1u);
  EXPECT_EQ(links()[0]->id, id) << "one finding while it lasts";

  run(seq, 200, [&](int32_t) { return healthy(); });
  EXPECT_TRUE(links().empty()) << "resolved once the link is healthy again";
}

TEST_F(SlowLinkTest, NothingIsJudgedWithoutTwoRanksProxySteps) {
  uint64_t seq = 0;
  // One rank's proxy steps alone (the others' agents asked for none).
  run(seq, 400, [&](int32_t r) -> std::optional<uint64_t> {
    if (r != 3) return std::nullopt;
    return 40 * kMs;
  });
  EXPECT_TRUE(links().empty());
  EXPECT_EQ(detector.tracked_comms(), 0u);
}

TEST_F(SlowLinkTest, ALinkSlowerByLessThanTheFloorIsNotNamed) {
  uint64_t seq = 0;
  // 3x as slow but only 1.5 ms more: beyond the ratio, within the floor.
  run(seq, 400, [&](int32_t r) -> std::optional<uint64_t> { return r == 2 ? 2'250'000 : 750'000; });
  EXPECT_TRUE(links().empty());
}

}  // namespace
}  // namespace rankscope::collector
