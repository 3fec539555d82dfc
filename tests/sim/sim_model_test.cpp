// The simulated fleet's training loops (rankscope-sim --pattern), without a
// collector: each pattern's calls and host waits per step, as its name says.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "bpf/nccl_events.h"
#include "tools/sim/model.h"

namespace rankscope::sim {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

struct Made {
  std::map<uint8_t, size_t> calls;  // op -> records of every rank
  size_t waits = 0;                 // host waits of every rank
  size_t comms = 0;                 // communicators of the job
  uint64_t steps = 0;
  size_t ranks = 0;
};

// One job of `pattern` on `nodes` nodes x 2 ranks, 100 ms steps, no GC-like pauses.
FleetConfig small_job(const std::string& pattern, int nodes) {
  FleetConfig config;
  config.pattern = pattern;
  config.jobs = 1;
  config.nodes_per_job = nodes;
  config.gpus = 2;
  config.step_ms = 100;
  config.gc_rate = 0;
  std::string why;
  EXPECT_TRUE(apply_pattern(config, &why)) << why;
  return config;
}

// One healthy job of `nodes` nodes x 2 ranks, 5 simulated seconds.
Made run(const std::string& pattern, int nodes = 2) {
  Fleet fleet(small_job(pattern, nodes));
  std::vector<std::vector<SimEvent>> out;
  fleet.advance(5 * kSecond, out);
  Made made;
  for (const auto& node : out)
    for (const SimEvent& e : node) e.wait ? ++made.waits : ++made.calls[e.call.op];
  made.comms = fleet.jobs()[0].comms.size();
  made.steps = fleet.steps()[0];
  made.ranks = fleet.total_ranks();
  return made;
}

TEST(SimPatterns, EachPatternMakesItsCallsAndHostWaitsPerStep) {
  Made ddp = run("ddp");
  ASSERT_GT(ddp.steps, 10u);
  EXPECT_EQ(ddp.comms, 1u) << "one communicator of every rank";
  EXPECT_EQ(ddp.calls[RS_OP_ALLREDUCE], ddp.steps * ddp.ranks * 2) << "--dp-buckets 2 a step";
  EXPECT_EQ(ddp.waits, ddp.steps * ddp.ranks) << "one host wait a step";

  Made each = run("sync-each");
  EXPECT_EQ(each.waits, each.calls[RS_OP_ALLREDUCE]) << "a host wait after every collective";

  Made fsdp = run("fsdp");
  EXPECT_EQ(fsdp.calls[RS_OP_ALLGATHER], fsdp.steps * fsdp.ranks * 140) << "70 layers forward and backward";
  EXPECT_EQ(fsdp.calls[RS_OP_REDUCESCATTER], fsdp.steps * fsdp.ranks * 70);
  EXPECT_EQ(fsdp.waits, fsdp.steps * fsdp.ranks);

  Made accum = run("accum");
  EXPECT_EQ(accum.calls[RS_OP_ALLREDUCE], accum.steps / 4 * accum.ranks * 2) << "collectives every 4th micro-step";

  Made tpdp = run("tp-dp");
  EXPECT_EQ(tpdp.comms, 2u + 2u) << "a tensor-parallel group per node, a data-parallel one per local rank";
  EXPECT_EQ(tpdp.calls[RS_OP_SEND], 0u);

  Made pipeline = run("pipeline", 4);  // two stages, two replicas
  EXPECT_GT(pipeline.calls[RS_OP_SEND], 0u);
  EXPECT_EQ(pipeline.calls[RS_OP_SEND], pipeline.calls[RS_OP_RECV]);
  EXPECT_GT(pipeline.calls[RS_OP_ALLREDUCE], 0u) << "the data-parallel AllReduce";
}

TEST(SimPatterns, AnUnknownPatternOrAnImpossibleFleetIsRefusedWithWhy) {
  FleetConfig config;
  std::string why;
  config.pattern = "zero-bubble";
  EXPECT_FALSE(apply_pattern(config, &why));
  EXPECT_NE(why.find("unknown --pattern zero-bubble"), std::string::npos) << why;
  config.pattern = "tp-dp";
  config.gpus = 1;
  EXPECT_FALSE(apply_pattern(config, &why));
  EXPECT_NE(why.find("--gpus 2"), std::string::npos) << why;
  config.pattern = "pipeline";
  config.nodes_per_job = 2;  // two stages, one replica: no data-parallel AllReduce
  EXPECT_FALSE(apply_pattern(config, &why));
  EXPECT_NE(why.find("two replicas"), std::string::npos) << why;
}

// The clocks' score compares stored issue times with true ones at sampled
// calls: every node is sampled, at least once in each 2 s, at 1 s steps
// of 3 collectives (sync-each) as at 200 (fsdp); accum's optimizer steps
// of 4 micro-steps of 250 ms, a pipeline's stages of ranks whose
// tensor-parallel communicators never call.
TEST(SimClockSamples, EveryNodeIsSampledEverySecondOrSoWhateverItsCallRate) {
  for (const std::string pattern : {"sync-each", "fsdp", "ddp", "accum", "jitter", "pipeline", "tp-dp"}) {
    FleetConfig config = small_job(pattern, 4);
    config.step_ms = pattern == "accum" ? 250 : 1000;
    Fleet fleet(config);
    std::vector<std::vector<SimEvent>> out;
    fleet.advance(20 * kSecond, out);
    std::map<int, std::vector<int64_t>> at;  // node -> sampled true times
    for (const auto& s : fleet.take_clock_samples()) at[s.node].push_back(s.true_ns);
    EXPECT_EQ(at.size(), fleet.nodes().size()) << pattern;
    for (auto& [node, times] : at) {
      std::sort(times.begin(), times.end());
      ASSERT_GE(times.size(), 2u) << pattern << " node " << node;
      int64_t widest = 0;
      for (size_t i = 1; i < times.size(); ++i) widest = std::max(widest, times[i] - times[i - 1]);
      EXPECT_LE(widest, 2 * kSecond) << pattern << " node " << node << ": " << times.size() << " samples";
      EXPECT_GE(times.back(), 17 * kSecond) << pattern << " node " << node << ": none in the last seconds";
    }
  }
}

// A rank slowed 1.5x, evenly or by stalls (--slowdown-shape): the job
// loses about the same time either way; evenly, the rank is late at every
// collective; by stalls, on time at most and at least --stall-ms late at some.
TEST(SimSlowdowns, StallsCostWhatEvenSlowingDoesButComeAtFewCollectives) {
  struct Shape {
    uint64_t steps = 0;
    std::vector<int64_t> late;  // the culprit's lateness at each collective while slowed
  };
  auto run = [](const std::string& shape) {
    FleetConfig config = small_job("ddp", 2);
    config.scenario = "slowdown";
    config.factor = 1.5;
    config.fault_after_s = 1;
    config.fault_window_s = 0;
    config.slowdown_shape = shape;
    Fleet fleet(config);
    std::vector<std::vector<SimEvent>> out;
    fleet.advance(20 * kSecond, out);
    Shape s;
    s.steps = fleet.steps()[0];
    for (const auto& [key, late] : fleet.lateness()) s.late.insert(s.late.end(), late.begin(), late.end());
    std::sort(s.late.begin(), s.late.end());
    return s;
  };
  Shape even = run("even"), stalls = run("stalls");
  ASSERT_GT(even.late.size(), 100u);
  ASSERT_GT(stalls.late.size(), 100u);
  EXPECT_NEAR(static_cast<double>(stalls.steps), static_cast<double>(even.steps), 0.1 * static_cast<double>(even.steps));
  const int64_t ms = 1'000'000;
  EXPECT_GT(even.late[even.late.size() / 2], 20 * ms) << "evenly: late at most collectives";
  EXPECT_LT(stalls.late[stalls.late.size() / 2], 5 * ms) << "by stalls: on time at most collectives";
  EXPECT_GE(stalls.late.back(), 100 * ms) << "... and a stall of at least --stall-ms at some";
}

TEST(SimSlowdowns, ARankWhoseHostRunsAheadLagsALittleAtEachCallAndArrivesEverLater) {
  // FSDP's host issues layer after layer without waiting: a slowed rank's
  // own time lags at each call by its extra compute for that layer, and its
  // arrivals fall further behind through the step. The truth keeps both,
  // the figures a slow rank's and a costly straggler's findings state.
  FleetConfig config = small_job("fsdp", 2);
  config.scenario = "slowdown";
  config.factor = 1.5;
  config.fault_after_s = 1;
  config.fault_window_s = 0;
  config.jitter_sigma = 0;
  Fleet fleet(config);
  std::vector<std::vector<SimEvent>> out;
  fleet.advance(10 * kSecond, out);
  auto median_of = [](const std::map<Fleet::LatenessKey, std::vector<int64_t>>& truth) {
    std::vector<int64_t> all;
    for (const auto& [key, values] : truth) all.insert(all.end(), values.begin(), values.end());
    std::sort(all.begin(), all.end());
    return all.empty() ? int64_t{0} : all[all.size() / 2];
  };
  ASSERT_EQ(fleet.own_lag().size(), fleet.lateness().size());
  const int64_t own = median_of(fleet.own_lag()), late = median_of(fleet.lateness());
  // A step of 100 ms over 3 calls a layer: half again of a layer's share.
  EXPECT_GT(own, 0);
  EXPECT_LT(own, 2'000'000) << "its own lag is a layer's extra compute";
  EXPECT_GT(late, 10 * own) << "its arrivals fall behind through the step";
}

}  // namespace
}  // namespace rankscope::sim
