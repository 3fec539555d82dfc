// Clock refinement from the collectives: ranks leave a blocking collective
// at nearly the same true time, so the end of the wait that follows it
// exposes an offset error the probes could not see (an asymmetric path).
// Fed as the collector feeds it: the matcher's issues and completions, the
// waits the ingest applies; a cluster model built by hand, no store, no wire.
#include "collector/model/clock_refine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "collector/match/matcher.h"
#include "collector/model/cluster.h"
#include "proto/records.h"
#include "tests/support/model.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kComm = 0xabcdef0123456789ull;
constexpr uint64_t kMs = 1'000'000ull;

class ClockRefineTest : public ::testing::Test {
 protected:
  ClockRefineTest() { matcher.subscribe(refiner); }

  // Two nodes of two ranks; the probes say offset 0 with an uncertainty of
  // `uncertainty_ns` (a round trip of twice that).
  void start(uint64_t uncertainty_ns) {
    for (const char* name : {"node-0", "node-1"}) {
      NodeState& node = model.nodes[name];
      node.name = name;
      node.clock.add({1000, 1000 + uncertainty_ns, 1000 + uncertainty_ns, 1000 + 2 * uncertainty_ns});
    }
    testing::add_comm(model, kComm, 4, "job-1");
  }

  // One step: every rank issues collective `seq` at `t` (rank r r ms
  // later) and then waits until `t + 10 ms`, the true time the collective
  // ends everywhere; node-1 stamps everything `node1_error` late. Times reach
  // the matcher on the cluster clock: the node's reading plus the refinement
  // now applied to it, as the ingest converts them. `early_end` makes rank
  // 0's wait end before the last rank arrived (impossible with right clocks).
  void step(uint64_t seq, uint64_t t, int64_t node1_error, bool early_end = false, int rank0_waits = 1) {
    CommState& comm = model.comms.at(kComm);
    for (int32_t rank = 0; rank < 4; ++rank) {
      MemberState& member = comm.members.at(rank);
      uint64_t issue = on_cluster(member.node, t + static_cast<uint64_t>(rank) * kMs, rank >= 2 ? node1_error : 0);
      proto::CallRecord call = testing::allreduce(member, seq, issue);
      matcher.on_record(comm, rank, 0, call);
    }
    for (int32_t rank = 0; rank < 4; ++rank) {
      const MemberState& member = comm.members.at(rank);
      int64_t error = rank >= 2 ? node1_error : 0;
      uint64_t start = on_cluster(member.node, t + static_cast<uint64_t>(rank) * kMs + 11'000, error);
      uint64_t end = early_end && rank == 0 ? on_cluster(member.node, t + kMs, error)
                                            : on_cluster(member.node, t + 10 * kMs, error);
      refiner.on_wait(member.node, member.pid, start, std::max(end, start));
      // More waits of rank 0 before the next collective (a synchronize
      // after each of its copies): each ends 20 ms after the one before.
      for (int w = 1; rank == 0 && w < rank0_waits; ++w)
        refiner.on_wait(member.node, member.pid, std::max(end, start) + 1'000,
                        std::max(end, start) + static_cast<uint64_t>(w) * 20 * kMs);
    }
  }
  uint64_t on_cluster(const std::string& node, uint64_t true_ns, int64_t error) {
    return static_cast<uint64_t>(static_cast<int64_t>(true_ns) + error + refinement(node));
  }
  void update() { model.adjust_clocks(refiner.update(), 0); }
  int64_t refinement(const std::string& node) { return model.nodes.at(node).clock.refinement_ns(); }

  ClusterModel model;
  CollectiveMatcher matcher;
  ClockRefiner refiner{model};
};

TEST_F(ClockRefineTest, CollectiveEndsCorrectAnOffsetTheProbesCouldNotSee) {
  start(5 * kMs);
  for (uint64_t s = 0; s < 20; ++s) {
    step(s, 100 * kMs * (s + 1), 3 * static_cast<int64_t>(kMs));
    update();
  }
  // node-1 reads 3 ms late: it is moved 3 ms earlier relative to node-0,
  // the two nodes' mean staying where the probes put it.
  EXPECT_NEAR(static_cast<double>(refinement("node-1") - refinement("node-0")), -3e6, 1e5);
  EXPECT_NEAR(static_cast<double>(refinement("node-1") + refinement("node-0")), 0, 1e5);
  EXPECT_EQ(model.nodes.at("node-0").clock_violations, 0u);
}

TEST_F(ClockRefineTest, RefinementStaysWithinWhatTheProbesAllow) {
  start(1 * kMs);
  for (uint64_t s = 0; s < 20; ++s) {
    step(s, 100 * kMs * (s + 1), 6 * static_cast<int64_t>(kMs));
    update();
  }
  EXPECT_LE(std::abs(refinement("node-1")), static_cast<int64_t>(model.nodes.at("node-1").clock.probe_uncertainty_ns()));
  EXPECT_LT(refinement("node-1"), 0);
}

TEST_F(ClockRefineTest, NothingChangesBeforeEnoughCollectivesEnded) {
  start(5 * kMs);
  for (uint64_t s = 0; s < 3; ++s) {
    step(s, 100 * kMs * (s + 1), 3 * static_cast<int64_t>(kMs));
    update();
  }
  EXPECT_EQ(refinement("node-0"), 0);
  EXPECT_EQ(refinement("node-1"), 0);
}

// Only the first wait after a collective is when the rank left it: the
// waits after, on the same collective, are the rank's own later work.
// Counted as more ends, they would fill the group without the other
// node's ranks (one node: nothing to align), and node-1's error would stay.
TEST_F(ClockRefineTest, OnlyTheFirstWaitAfterACollectiveIsItsEnd) {
  start(5 * kMs);
  for (uint64_t s = 0; s < 20; ++s) {
    step(s, 100 * kMs * (s + 1), 3 * static_cast<int64_t>(kMs), false, /*rank0_waits=*/3);
    update();
  }
  EXPECT_NEAR(static_cast<double>(refinement("node-1") - refinement("node-0")), -3e6, 1e5);
  EXPECT_EQ(model.nodes.at("node-0").clock_violations, 0u);
}

TEST_F(ClockRefineTest, LeavingBeforeTheLastArrivalIsCountedAsAViolation) {
  start(5 * kMs);
  step(0, 100 * kMs, 0, /*early_end=*/true);
  EXPECT_EQ(model.nodes.at("node-0").clock_violations, 0u) << "counted into the model at the next update";
  update();
  EXPECT_EQ(model.nodes.at("node-0").clock_violations, 1u);
  EXPECT_EQ(model.nodes.at("node-1").clock_violations, 0u);
  update();
  EXPECT_EQ(model.nodes.at("node-0").clock_violations, 1u) << "each violation counted once";
}

}  // namespace
}  // namespace rankscope::collector
