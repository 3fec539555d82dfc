// The simulated fleet's training loops (rankscope-sim --pattern), without a
// collector: each pattern's calls and host waits per step, as its name says.
#include <gtest/gtest.h>

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

// One healthy job of `nodes` nodes x 2 ranks, 5 simulated seconds of 100 ms steps.
Made run(const std::string& pattern, int nodes = 2) {
  FleetConfig config;
  config.pattern = pattern;
  config.jobs = 1;
  config.nodes_per_job = nodes;
  config.gpus = 2;
  config.step_ms = 100;
  config.gc_rate = 0;
  std::string why;
  EXPECT_TRUE(apply_pattern(config, &why)) << why;
  Fleet fleet(config);
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

}  // namespace
}  // namespace rankscope::sim
