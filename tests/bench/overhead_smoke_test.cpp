// The overhead benchmark (bench/overhead.cpp) in its tiny mode, so that it
// never rots: it must run end to end with real probes, a real agent and a real
// collector, and print figures that parse. The figures themselves are not
// judged here (no timed assertions); scripts/bench-overhead.sh measures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <regex>
#include <string>

#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

std::map<std::string, double> parse_flat_json(const std::string& text) {
  std::map<std::string, double> values;
  std::regex pair("\"([a-z_]+)\":(-?[0-9.eE+-]+|nan|inf|-nan|-inf)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pair); it != std::sregex_iterator(); ++it)
    values[(*it)[1]] = std::stod((*it)[2]);
  return values;
}

TEST(BenchOverhead, SmokeRunPrintsEveryFigure) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF probes need root: run the suite as root (sudo make test)";
  TempDir dir;
  SpawnOptions bench;
  bench.argv = {bin_path("rankscope-bench-overhead"), "--smoke", "--json", dir.file("figures.json")};
  bench.stdout_path = dir.file("out.md");
  bench.stderr_path = dir.file("err.log");
  Process run(bench);
  ASSERT_EQ(run.wait(std::chrono::seconds(120)), 0) << slurp(dir.file("out.md")) << slurp(dir.file("err.log"));

  auto figures = parse_flat_json(slurp(dir.file("figures.json")));
  for (const char* name :
       {"noop_bare_mean_ns_median", "noop_probed_mean_ns_median", "floor_mean_ns_median", "floor_mean_ns_min",
        "floor_mean_ns_max", "nccl_bare_mean_ns_median", "nccl_agent_mean_ns_median", "added_mean_ns_median",
        "added_mean_ns_min", "added_mean_ns_max", "floor_median_call_ns_median", "added_median_call_ns_median",
        "nccl_bare_median_call_ns_median", "nccl_agent_median_call_ns_median", "added_over_floor",
        "added_over_floor_mean", "nccl_bare_switches_per_call", "nccl_agent_switches_per_call", "paced_calls", "paced_seconds", "paced_rate", "agent_idle_cpu_percent_stat",
        "agent_paced_cpu_percent_stat", "agent_paced_cpu_percent_schedstat", "traced_calls", "records_stored",
        "prog_noop_entry_ns", "prog_noop_return_ns", "prog_agent_entry_ns", "prog_agent_return_ns",
        // the ranks run
        "ranks_added_median_call_ns", "ranks_added_cpu_ns_per_call", "ranks_pair_added_median_call_ns",
        "ranks_pair_added_cpu_ns_per_call", "ranks_added_over_pair", "ranks_agent_cpu_percent_schedstat",
        "ranks_prog_nccl_allreduce__runs_per_call", "ranks_prog_nccl_call_retur_runs_per_call"}) {
    ASSERT_TRUE(figures.count(name)) << "missing " << name << " in " << slurp(dir.file("figures.json"));
    EXPECT_TRUE(std::isfinite(figures[name])) << name;
  }
  // Counts, not timings: the smoke mode makes 2 repetitions of (50 warm-up +
  // 200 timed) traced calls, one call that starts the paced run, and a 1 s
  // paced run at 1,000 calls/s, plus 200 in the pass with kernel.bpf_stats on;
  // then 2 ranks, each 100 warm-up and 0.5 s at 200 calls/s, traced once
  // timed and once with kernel.bpf_stats on.
  EXPECT_EQ(figures["reps"], 2);
  EXPECT_EQ(figures["paced_calls"], 1000);
  EXPECT_EQ(figures["ranks"], 2);
  EXPECT_EQ(figures["traced_calls"], 2 * (50 + 200) + 200 + 1 + 1000 + 2 * 2 * (100 + 100));
  // Every rank's call ran both probes of the agent, once each, in the pass
  // with kernel.bpf_stats on.
  EXPECT_EQ(figures["ranks_prog_nccl_allreduce__runs_per_call"], 1);
  EXPECT_NEAR(figures["ranks_prog_nccl_call_retur_runs_per_call"], 1, 0.02);
  // Every traced call reached the collector as a record.
  EXPECT_EQ(figures["records_stored"], figures["traced_calls"]);
  for (const char* name : {"noop_bare_mean_ns_median", "noop_probed_mean_ns_median", "nccl_bare_mean_ns_median",
                           "nccl_agent_mean_ns_median", "noop_probed_median_call_ns_median",
                           "nccl_agent_median_call_ns_median", "paced_seconds", "agent_paced_cpu_percent_schedstat"})
    EXPECT_GT(figures[name], 0) << name;

  std::string markdown = slurp(dir.file("out.md"));
  EXPECT_NE(markdown.find("| **floor** (difference) |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| **added by the agent** (difference) |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("Added / floor: **"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("Time inside the BPF programs per call (kernel.bpf_stats"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| 1: bare uprobe/uretprobe |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("Added by the agent / by the bare pair, median call: **"), std::string::npos) << markdown;
}

}  // namespace
}  // namespace rankscope::testing
