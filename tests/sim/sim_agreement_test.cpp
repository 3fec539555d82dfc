// The simulator's ground truth against the real collector's findings, over
// real sockets: one seeded run with a job per fault type (a slowed rank, a
// slowed node, a stopped rank, a killed rank, a mismatched collective, a dead
// agent) next to a healthy job, on nodes whose clocks are off by up to two
// seconds and drift, with lost, reordered and re-sent batches and records
// lost before the wire. The collector never sees the truth file.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "tests/support/harness.h"
#include "tools/sim/jsonl.h"

namespace rankscope::testing {
namespace {

class SimAgreement : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    int agent_port = free_port(), query_port = free_port();
    std::string agents = "tcp://127.0.0.1:" + std::to_string(agent_port);
    std::string query = "tcp://127.0.0.1:" + std::to_string(query_port);
    Process collector({{bin_path("rankscope-collector"), "--listen", agents, "--query", query, "--db",
                        dir_->file("db"), "--hang-timeout-s", "3", "--node-lost-timeout-s", "3", "--insecure"},
                       {},
                       "",
                       dir_->file("collector.log"), ""});  // stderr: with stdout
    std::string truth = dir_->file("truth.jsonl"), scores = dir_->file("scores.jsonl");
    Process sim({{bin_path("rankscope-sim"), "run", "--collector", agents, "--truth", truth, "--scenario", "mixed",
                  "--seed", "7", "--jobs", "7", "--nodes-per-job", "6", "--gpus", "4", "--pp", "2", "--step-ms", "50",
                  "--duration-s", "30", "--fault-after-s", "5", "--fault-window-s", "2", "--factor", "2",
                  "--max-skew-s", "2", "--max-drift-ppm", "30", "--probe-jitter-ms", "1", "--batch-loss", "0.02",
                  "--batch-reorder", "0.05", "--record-loss", "0.0005"},
                 {},
                 "",
                 dir_->file("sim.log"), ""});
    sim_exit_ = sim.wait(std::chrono::seconds(60));
    Process score({{bin_path("rankscope-sim"), "score", "--query", query, "--truth", truth, "--out", scores},
                   {},
                   "",
                   dir_->file("score.log"), ""});
    score_exit_ = score.wait(std::chrono::seconds(60));
    auto lines = sim::read_json_lines(scores);
    if (lines) lines_ = new std::vector<sim::JsonObject>(std::move(*lines));
  }
  static void TearDownTestSuite() {
    delete lines_;
    lines_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_EQ(sim_exit_, 0) << slurp(dir_->file("sim.log"));
    ASSERT_EQ(score_exit_, 0) << slurp(dir_->file("score.log"));
    ASSERT_NE(lines_, nullptr) << "no scores written";
  }
  static std::vector<sim::JsonObject> of_type(const std::string& type) {
    std::vector<sim::JsonObject> out;
    for (const auto& l : *lines_)
      if (l.str("type") == type) out.push_back(l);
    return out;
  }
  static std::string context() { return slurp(dir_->file("scores.jsonl")); }

  static TempDir* dir_;
  static int sim_exit_, score_exit_;
  static std::vector<sim::JsonObject>* lines_;
};
TempDir* SimAgreement::dir_ = nullptr;
int SimAgreement::sim_exit_ = -1;
int SimAgreement::score_exit_ = -1;
std::vector<sim::JsonObject>* SimAgreement::lines_ = nullptr;

TEST_F(SimAgreement, EveryFaultIsFoundAndPinnedOnItsCulprit) {
  std::map<std::string, sim::JsonObject> incidents;
  for (const auto& i : of_type("incident")) incidents[i.str("kind")] = i;
  for (const char* kind : {"slowdown_rank", "slowdown_node", "hang_stop", "hang_kill", "mismatch", "agent_death"}) {
    SCOPED_TRACE(kind);
    ASSERT_TRUE(incidents.count(kind)) << context();
    const auto& i = incidents[kind];
    EXPECT_TRUE(i.flag("detected")) << context();
    if (i.flag("detected")) RecordProperty(std::string(kind) + "_latency_s", std::to_string(i.num("latency_s")));
  }
  // Hangs, mismatches and lost nodes: the first finding names the culprit
  // rank and node (a stopped rank's other stalled communicators are folded
  // into its finding). A slowdown can also surface on the rank that waited
  // for the culprit through the pipeline: the benchmark measures how often.
  for (const char* kind : {"hang_stop", "hang_kill", "mismatch", "agent_death"}) {
    EXPECT_TRUE(incidents[kind].flag("rank_ok")) << kind << "\n" << context();
    EXPECT_TRUE(incidents[kind].flag("node_ok")) << kind << "\n" << context();
  }
  // A hang is named within the hang timeout (3 s) + 2 s of the rank stopping.
  for (const char* kind : {"hang_stop", "hang_kill"}) EXPECT_LT(incidents[kind].num("latency_s"), 5.0) << context();
  // A mismatch is reported as soon as both calls are in, not after the hang
  // timeout: within the agents' batching, or one re-send (2 s) when a
  // batch carrying it was lost.
  EXPECT_LT(incidents["mismatch"].num("latency_s"), 2.6) << context();
  // The reported lateness of a 2x slowed rank is the true one within 25%.
  EXPECT_LT(std::fabs(incidents["slowdown_rank"].num("cost_rel_err", 1)), 0.25) << context();
}

TEST_F(SimAgreement, NoJobRaisesAFindingNoFaultExplains) {
  // Neither the healthy job nor the faulty ones before or beside their
  // fault (a node's first seconds, whose clock is still loose, included).
  for (const auto& f : of_type("false_alarm"))
    ADD_FAILURE() << (f.flag("healthy_job") ? "healthy job: " : "faulty job: ") << f.str("summary");
  auto exposure = of_type("exposure");
  ASSERT_EQ(exposure.size(), 1u);
  EXPECT_EQ(exposure[0].i64("healthy_jobs"), 1);
  EXPECT_GT(exposure[0].i64("healthy_steps"), 100);
}

TEST_F(SimAgreement, LostAndReorderedBatchesAreStoredOnceAndLostRecordsCounted) {
  auto delivery = of_type("delivery");
  ASSERT_EQ(delivery.size(), 1u);
  const auto& d = delivery[0];
  EXPECT_GT(d.i64("sends_lost"), 0) << "the run must exercise re-sending";
  EXPECT_GT(d.i64("reordered"), 0) << "the run must exercise reordering";
  EXPECT_GT(d.i64("records_lost"), 0) << "the run must exercise ring-buffer loss";
  // Everything acknowledged is stored, nothing twice: between what the
  // agents saw acknowledged and what they sent (the dead agent's batches
  // may be stored without its having seen the ack).
  EXPECT_GE(d.i64("records_stored"), d.i64("records_acked"));
  EXPECT_LE(d.i64("records_stored"), d.i64("records_sent"));
  EXPECT_GT(d.i64("records_acked"), d.i64("records_sent") * 9 / 10);
  EXPECT_EQ(d.i64("records_lost_reported"), d.i64("records_lost"));
  EXPECT_EQ(d.i64("bad_messages"), 0);
}

TEST_F(SimAgreement, ClockOffsetsOfSecondsAreCorrectedWithinTheStatedUncertainty) {
  auto clocks = of_type("clock");
  // Nodes of the jobs still running at the end (stopped jobs stop sampling).
  ASSERT_GE(clocks.size(), 8u) << context();
  for (const auto& c : clocks) {
    SCOPED_TRACE(c.str("node"));
    // Nodes' wall clocks are up to 2 s off; after correction the stored
    // issue times are within the collector's own uncertainty (+0.2 ms: the
    // uncertainty is taken from the newest probes, the error over the last
    // few seconds).
    EXPECT_LT(std::fabs(c.num("error_ns")), c.num("uncertainty_ns") + 200'000) << context();
  }
}

}  // namespace
}  // namespace rankscope::testing
