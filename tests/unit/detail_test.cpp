// Detail on demand (collector/detect/detail.h): which communicators' NCCL
// proxy steps the collector asks the agents for, fed through the GPU
// matcher as the ingest feeds it: a model built by hand, no wire messages.
#include "collector/detect/detail.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "collector/detect/findings.h"
#include "collector/detect/link.h"
#include "collector/match/gpu_matcher.h"
#include "collector/model/cluster.h"
#include "proto/records.h"
#include "tests/support/model.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kMs = 1'000'000ull;
constexpr uint64_t kSecond = 1000 * kMs;
constexpr uint64_t kComm = 0x5eed0000d0d0d0d0ull;
constexpr uint64_t kOther = 0x5eed0000e0e0e0e0ull;
constexpr int32_t kRanks = 8;

struct Shape {
  double transfer_scale = 1.0;  // the transfer after the last start
  int32_t late_rank = -1;       // a rank whose kernels start late (its host or GPU)
  uint64_t late_ns = 0;
  int32_t slow_sender = -1;  // proxy steps seen, this rank's link far beyond the others
};

// An 8-rank job (two ranks a node), one 4 MiB AllReduce every 50 ms. Per
// collective each rank's kernels start when its GPU reaches it (a few
// hundred microseconds apart, now and then one rank tens of milliseconds
// late) and all end together once the last has moved its data: the
// transfer after the last start takes about 4 ms, with noise and spikes.
class DetailTest : public ::testing::Test {
 protected:
  DetailTest() {
    testing::add_comm(model, kComm, kRanks, "job-1");
    matcher.subscribe(links);
    matcher.subscribe(policy);
  }

  void collective(uint64_t seq, const Shape& shape) {
    const CommState& comm = model.comms.at(kComm);
    const uint64_t t = 1'000'000 * kMs + seq * 50 * kMs;
    std::exponential_distribution<double> skew(1.0 / 300e3);
    std::vector<uint64_t> start(kRanks);
    uint64_t last = 0;
    for (int32_t r = 0; r < kRanks; ++r) {
      start[r] = t + static_cast<uint64_t>(skew(random)) + (r == shape.late_rank ? shape.late_ns : 0);
      last = std::max(last, start[r]);
    }
    std::lognormal_distribution<double> transfer(std::log(4e6), 0.2);
    double x = transfer(random);
    if (std::uniform_real_distribution<double>(0, 1)(random) < 0.03) x += 3e6;  // a spike
    const uint64_t end = last + static_cast<uint64_t>(x * shape.transfer_scale);
    for (int32_t r = 0; r < kRanks; ++r) {
      proto::GpuRecord g{seq, 1u << 20, start[r] - 100'000, start[r], end};
      if (shape.slow_sender >= 0) {
        g.link_peer = (r + 1) % kRanks;
        g.link_wait_ns = r == shape.slow_sender ? 30 * kMs : kMs;
      }
      matcher.on_gpu(comm, r, RS_OP_ALLREDUCE, g);
    }
    now = end + kMs;
  }
  // `count` collectives, evaluated after each 10 (twice a second, as the collector's loop does).
  void run(uint64_t& seq, int count, const Shape& shape = {}) {
    for (int i = 0; i < count; ++i) {
      collective(seq++, shape);
      if (i % 10 == 9) evaluate();
    }
  }
  void evaluate() {
    links.evaluate(now);
    policy.evaluate(now);
  }
  // Quiet time with no collective (evaluated every 0.5 s).
  void idle(uint64_t ns) {
    for (uint64_t end = now + ns; now < end;) {
      now += kSecond / 2;
      evaluate();
    }
  }
  std::vector<std::string> asked_nodes() const {
    std::vector<std::string> out;
    for (const auto& [node, comms] : policy.by_node()) out.push_back(node);
    return out;
  }

  ClusterModel model;
  GpuMatcher matcher;
  FindingBook book;
  LinkDetector links{model, book};
  DetailPolicy policy{model, book, links};
  std::mt19937_64 random{11};
  uint64_t now = 0;
};

TEST_F(DetailTest, AHealthyJobIsNeverAskedForProxySteps) {
  uint64_t seq = 0;
  run(seq, 4000);  // 200 s of collectives, spikes and skew and all
  EXPECT_EQ(policy.wanted_comms(), 0u);
  EXPECT_TRUE(policy.by_node().empty());
  EXPECT_EQ(policy.counts().rise, 0u);
}

TEST_F(DetailTest, ARankThatArrivesLateDoesNotStretchTheShortestKernel) {
  uint64_t seq = 0;
  run(seq, 400);
  // Rank 3 starts 40 ms late every time (its host issues late, or its GPU
  // is slow to reach the collective): the others' kernels wait for it and
  // run 10x as long, but rank 3's own kernel is the transfer alone.
  Shape late;
  late.late_rank = 3;
  late.late_ns = 40 * kMs;
  run(seq, 400, late);
  EXPECT_EQ(policy.counts().rise, 0u) << "a late arrival is the straggler detectors' to judge, not a link's";
}

TEST_F(DetailTest, ATransferThatSlowsDownAsksEveryNodeOfTheJobUntilItHasBeenJudged) {
  testing::add_comm(model, kOther, 2, "job-2");  // ranks on node-0 too; not asked for
  uint64_t seq = 0;
  run(seq, 400);
  ASSERT_EQ(policy.wanted_comms(), 0u);

  // A link slows: every collective's transfer takes 3x as long (no proxy
  // steps were asked for, so only the kernels show it).
  Shape slow;
  slow.transfer_scale = 3.0;
  run(seq, 20, slow);
  EXPECT_EQ(policy.counts().rise, 1u);
  EXPECT_EQ(policy.wanted_comms(), 1u);
  EXPECT_EQ(asked_nodes(), (std::vector<std::string>{"node-0", "node-1", "node-2", "node-3"}));
  EXPECT_EQ(policy.by_node().at("node-0"), (std::vector<uint64_t>{kComm})) << "job-2's communicator is not asked for";

  run(seq, 200, slow);
  EXPECT_EQ(policy.wanted_comms(), 1u);
  EXPECT_EQ(policy.counts().rise, 1u) << "one request while it lasts";

  // Nothing confirms it (no proxy steps come in this test) and it becomes
  // the kernels' baseline: the request ends 30 s after the last sign.
  run(seq, 1200, slow);
  EXPECT_EQ(policy.wanted_comms(), 0u);
  EXPECT_TRUE(policy.by_node().empty());
}

TEST_F(DetailTest, AnOpenFindingKeepsItsCommunicatorAskedForUntilItIsResolved) {
  uint64_t seq = 0;
  run(seq, 100);
  Finding f;
  f.kind = FindingKind::straggler;
  f.job = "job-1";
  f.comm = kComm;
  f.ranks = {5};
  f.summary = "straggler in job job-1: rank 5 (a test's)";
  book.raise(f, now);
  evaluate();
  EXPECT_EQ(policy.wanted_comms(), 1u);
  EXPECT_EQ(policy.counts().finding, 1u);
  idle(120 * kSecond);
  EXPECT_EQ(policy.wanted_comms(), 1u) << "for as long as it is open";
  book.resolve(f.key(), now);
  idle(31 * kSecond);
  EXPECT_EQ(policy.wanted_comms(), 0u);

  Finding mismatch = f;
  mismatch.kind = FindingKind::mismatch;
  book.raise(mismatch, now);
  idle(kSecond);
  EXPECT_EQ(policy.wanted_comms(), 0u) << "a mismatch is in the host's calls: the links cannot tell more";
}

TEST_F(DetailTest, ALinkBeyondTheOthersInASampleIsFollowedUp) {
  uint64_t seq = 0;
  run(seq, 400);
  // A few collectives with proxy steps (the agents' background sample),
  // in which rank 6's link waited 30x as long as the others: too few for a
  // finding, enough to ask for more.
  Shape sampled;
  sampled.slow_sender = 6;
  run(seq, 5, sampled);
  evaluate();
  EXPECT_TRUE(book.open().empty());
  EXPECT_EQ(policy.counts().link, 1u);
  EXPECT_EQ(policy.wanted_comms(), 1u);

  // The job goes quiet (a long checkpoint): that sample is the last the
  // communicator has, but once it is older than the hold it is no lead.
  idle(3 * DetailOptions{}.hold_ns / 2);
  EXPECT_EQ(policy.wanted_comms(), 0u) << "an idle communicator is not asked for on an old sample";
  EXPECT_TRUE(policy.by_node().empty());
}

TEST_F(DetailTest, ACommunicatorThatEndsIsNoLongerAskedFor) {
  uint64_t seq = 0;
  run(seq, 400);
  Shape slow;
  slow.transfer_scale = 3.0;
  run(seq, 20, slow);
  ASSERT_EQ(policy.wanted_comms(), 1u);
  model.comms.at(kComm).ended = true;
  evaluate();
  EXPECT_EQ(policy.wanted_comms(), 0u);
  EXPECT_TRUE(policy.by_node().empty());
}

}  // namespace
}  // namespace rankscope::collector
