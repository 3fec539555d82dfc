// Clock refinement from the collectives: ranks leave a blocking collective
// at nearly the same true time, so the end of the wait that follows it
// exposes an offset error the probes could not see (an asymmetric path).
#include "collector/model/clock_refine.h"

#include <gtest/gtest.h>

#include "tests/support/feed.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"
#include "tests/support/store_commit.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kComm = 0xabcdef0123456789ull;
constexpr uint64_t kMs = 1'000'000ull;

using FixedClock = testing::ManualClock;

class ClockRefineTest : public ::testing::Test {
 protected:
  void send(const std::string& node, const std::function<void(wire::AgentMessage::Builder)>& fill) {
    testing::feed(ingest, commit, node, fill);
  }

  // Two nodes of two ranks; the probes say offset 0 with an uncertainty of
  // `uncertainty_ns` (a round trip of twice that).
  void start(uint64_t uncertainty_ns) {
    for (int node = 0; node < 2; ++node) {
      std::string name = "node-" + std::to_string(node);
      testing::feed(ingest, commit, name, testing::hello_message(name, 1));
      send(name, [&](auto m) {
        auto b = m.initBatch();
        b.setInstanceId(1);
        b.setSeq(++seq_of[name]);
        auto comms = b.initComms(2);
        for (int i = 0; i < 2; ++i) {
          comms[i].setPid(100 + 2 * node + i);
          comms[i].setCommHash(kComm);
          comms[i].setRank(2 * node + i);
          comms[i].setNranks(4);
        }
        auto samples = b.initClockSamples(1);
        samples[0].setT1(1000);
        samples[0].setT2(1000 + uncertainty_ns);
        samples[0].setT3(1000 + uncertainty_ns);
        samples[0].setT4(1000 + 2 * uncertainty_ns);
      });
    }
  }

  // One step: every rank issues collective `seq` at `t` and then waits until
  // `t + 10 ms`, the true time the collective ends everywhere; node-1 stamps
  // everything `node1_error` late. `early_end` makes rank 0's wait end before
  // the last rank arrived (impossible with right clocks).
  void step(uint64_t seq, uint64_t t, int64_t node1_error, bool early_end = false) {
    for (int node = 0; node < 2; ++node) {
      std::string name = "node-" + std::to_string(node);
      int64_t error = node == 1 ? node1_error : 0;
      send(name, [&](auto m) {
        auto b = m.initBatch();
        b.setInstanceId(1);
        b.setSeq(++seq_of[name]);
        std::vector<proto::ColumnBlock> blocks(2);
        std::vector<proto::WaitBlock> waits(2);
        for (int i = 0; i < 2; ++i) {
          int rank = 2 * node + i;
          proto::CallRecord r;
          r.seq = seq;
          r.issue_ns = t + static_cast<uint64_t>(error) + static_cast<uint64_t>(rank) * kMs;
          r.return_ns = r.issue_ns + 1000;
          r.op = RS_OP_ALLREDUCE;
          r.datatype = 7;
          r.count = 64;
          blocks[i].pid = 100 + rank;
          blocks[i].comm_hash = kComm;
          blocks[i].rank = rank;
          blocks[i].records.push_back(r);
          uint64_t end = t + 10 * kMs + static_cast<uint64_t>(error);
          if (early_end && rank == 0) end = t + kMs;  // before rank 3 arrived at t + 3 ms
          waits[i].pid = 100 + rank;
          waits[i].tid = 100 + rank;
          waits[i].waits.push_back(proto::WaitRecord{1, 0x10, r.return_ns + 1000, std::max(end, r.return_ns + 1000), 0});
        }
        proto::encode_collectives({&blocks[0], &blocks[1]}, b);
        proto::encode_waits(waits, b);
      });
    }
  }

  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  FixedClock clock{1'000'000 * kMs};
  testing::StoreCommit commit{*store};
  Ingest ingest{*store, commit, clock};
  ClockRefiner refiner{ingest};
  std::map<std::string, uint64_t> seq_of;

  void SetUp() override { ingest.add_observer(&refiner); }
  int64_t refinement(const std::string& node) { return ingest.node(node)->clock.refinement_ns(); }
};

TEST_F(ClockRefineTest, CollectiveEndsCorrectAnOffsetTheProbesCouldNotSee) {
  start(5 * kMs);
  for (uint64_t s = 0; s < 20; ++s) {
    step(s, 100 * kMs * (s + 1), 3 * static_cast<int64_t>(kMs));
    refiner.update();
  }
  // node-1 reads 3 ms late: it is moved 3 ms earlier relative to node-0,
  // the two nodes' mean staying where the probes put it.
  EXPECT_NEAR(static_cast<double>(refinement("node-1") - refinement("node-0")), -3e6, 1e5);
  EXPECT_NEAR(static_cast<double>(refinement("node-1") + refinement("node-0")), 0, 1e5);
  EXPECT_EQ(ingest.node("node-0")->clock_violations, 0u);
}

TEST_F(ClockRefineTest, RefinementStaysWithinWhatTheProbesAllow) {
  start(1 * kMs);
  for (uint64_t s = 0; s < 20; ++s) {
    step(s, 100 * kMs * (s + 1), 6 * static_cast<int64_t>(kMs));
    refiner.update();
  }
  EXPECT_LE(std::abs(refinement("node-1")), static_cast<int64_t>(ingest.node("node-1")->clock.probe_uncertainty_ns()));
  EXPECT_LT(refinement("node-1"), 0);
}

TEST_F(ClockRefineTest, LeavingBeforeTheLastArrivalIsCountedAsAViolation) {
  start(5 * kMs);
  step(0, 100 * kMs, 0, /*early_end=*/true);
  EXPECT_EQ(ingest.node("node-0")->clock_violations, 1u);
  EXPECT_EQ(ingest.node("node-1")->clock_violations, 0u);
}

}  // namespace
}  // namespace rankscope::collector
