// The detectors end to end, all real: fakenccl-train ranks in network
// namespaces, two agents tracing them with eBPF, the collector finding what
// is wrong (or, for a healthy job, nothing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "collector/alert/http.h"
#include "common/clock.h"
#include "tests/support/alertmanager.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

constexpr int kRanks = 4, kNodes = 2;

struct JobOptions {
  std::vector<std::string> args;                    // fakenccl-train arguments besides the id file
  std::map<int, std::vector<std::string>> rank_args; // extra arguments of one rank
  std::map<int, int> cpu;                            // pin a rank to a CPU (taskset)
  std::map<std::string, std::string> env;            // every rank's environment, added
  std::map<int, std::map<std::string, std::string>> rank_env;  // one rank's, added
};

// NCCL's profiler plugin, rankscope's, in every rank: the GPU side too.
constexpr const char* kPlugin = RANKSCOPE_PROFILER_PLUGIN;

std::vector<Process> launch_job(const TempDir& dir, const NetnsCluster& cluster, const JobOptions& job) {
  std::vector<Process> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    SpawnOptions spawn;
    if (job.cpu.count(rank)) spawn.argv = {"/usr/bin/taskset", "-c", std::to_string(job.cpu.at(rank))};
    spawn.argv.push_back(bin_path("fakenccl-train"));
    spawn.argv.insert(spawn.argv.end(), {"--id-file", dir.file("nccl.id"), "--quiet"});
    spawn.argv.insert(spawn.argv.end(), job.args.begin(), job.args.end());
    if (job.rank_args.count(rank))
      spawn.argv.insert(spawn.argv.end(), job.rank_args.at(rank).begin(), job.rank_args.at(rank).end());
    spawn.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(kRanks)},
                 {"LOCAL_RANK", std::to_string(rank % 2)},
                 {"RANKSCOPE_JOB_ID", "e2e-job"}};
    spawn.env.insert(job.env.begin(), job.env.end());
    if (job.rank_env.count(rank)) spawn.env.insert(job.rank_env.at(rank).begin(), job.rank_env.at(rank).end());
    spawn.netns = cluster.name(rank / 2);
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  return ranks;
}

std::string dump(TestDeployment& deployment, const TempDir& dir) {
  std::string out = "findings:\n";
  for (const auto& f : deployment.findings(false)) out += "  [" + f.kind + "] " + f.detail + "\n";
  out += "collector log:\n" + slurp(dir.file("collector.log"));
  return out;
}

std::vector<SeenFinding> of_kind(const std::vector<SeenFinding>& all, const std::string& kind) {
  std::vector<SeenFinding> out;
  for (const auto& f : all)
    if (f.kind == kind) out.push_back(f);
  return out;
}

class DetectE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
    ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  }
  void deploy(DeploymentOptions options = {}) {
    options.collector_args.insert(options.collector_args.end(), {"--hang-timeout-s", "2"});
    deployment = std::make_unique<TestDeployment>(dir, cluster, kNodes, options);
    ASSERT_TRUE(deployment->wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));
  }
  // A job with the plugin whose rank `rank` gets `env` (a GPU-side fault
  // armed by the file `trigger`); once the agents have read 100
  // collectives a rank's worth of GPU records (the plugin writes only while
  // someone reads, and a kernel start unread cannot be told), the file is
  // made. Returns the hangs open once one is (none after 60 s).
  std::vector<SeenFinding> gpu_fault_hang(DeploymentOptions options, int rank,
                                          std::map<std::string, std::string> env, const std::string& trigger) {
    const int metrics_port = free_port();
    options.collector_args.insert(options.collector_args.end(), {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
    deploy(options);
    JobOptions job;
    job.args = {"--steps", "100000", "--compute-iters", "200000", "--bucket-elems", "1024"};
    job.env = {{"NCCL_PROFILER_PLUGIN", kPlugin}};
    job.rank_env[rank] = std::move(env);
    fault_job = launch_job(dir, cluster, job);
    const std::string taken = "rankscope_ingest_gpu_records_total{result=\"taken\"}";
    if (!wait_for([&] { return collector_metric(metrics_port, taken) >= 4 * 100; }, std::chrono::seconds(60))) {
      ADD_FAILURE() << "no GPU records taken: " << dump(*deployment, dir);
      return {};
    }
    std::ofstream(trigger).close();
    std::vector<SeenFinding> hangs;
    wait_for(
        [&] {
          hangs = of_kind(deployment->findings(true), "hang");
          return !hangs.empty();
        },
        std::chrono::seconds(60));
    return hangs;
  }
  bool wait_progress(int64_t seq) {
    return wait_for([&] { return deployment->min_progress() >= seq; }, std::chrono::seconds(60));
  }

  TempDir dir;
  NetnsCluster cluster{kNodes};
  std::unique_ptr<TestDeployment> deployment;
  std::vector<Process> fault_job;  // the ranks gpu_fault_hang started: they go before the deployment
};

// A stress-ng CPU hog on the victim's core: the victim computes slower and
// arrives late at every collective.
void expect_cpu_contention_straggler(TestDeployment& deployment, const TempDir& dir,
                                     const NetnsCluster& cluster, int victim) {
  JobOptions job;
  // Steps long enough (2M iterations, ~6 ms alone on a core) that the
  // scheduler's credit for a task waking from sleep cannot hide the hogs.
  job.args = {"--steps", "100000", "--compute-iters", "2000000", "--bucket-elems", "1024"};
  for (int rank = 0; rank < kRanks; ++rank) job.cpu[rank] = rank == victim ? 1 : 0;
  auto ranks = launch_job(dir, cluster, job);
  // The hog arrives once the job has run a while: lateness a rank has had
  // since its first collectives is its structural baseline, not a fault
  // (docs/detection.md); a slowdown that appears is.
  ASSERT_TRUE(wait_for([&] { return deployment.min_progress() >= 40; }, std::chrono::seconds(60)))
      << dump(deployment, dir);
  SpawnOptions hog;
  hog.argv = {"/usr/bin/taskset", "-c", "1", "/usr/bin/stress-ng", "--cpu", "8", "--timeout", "120s", "--quiet"};
  Process stress(hog);

  std::vector<SeenFinding> stragglers;
  bool found = wait_for(
      [&] {
        stragglers = of_kind(deployment.findings(true), "straggler");
        return !stragglers.empty();
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(found) << dump(deployment, dir);
  // Give the others the same chance to be (wrongly) flagged.
  observe_for(std::chrono::seconds(3));
  stragglers = of_kind(deployment.findings(false), "straggler");
  ASSERT_EQ(stragglers.size(), 1u) << dump(deployment, dir);
  EXPECT_EQ(stragglers[0].ranks, std::vector<int32_t>{victim}) << stragglers[0].detail;
  EXPECT_EQ(stragglers[0].nodes, std::vector<std::string>{deployment.node_name(victim / 2)});
  // The host context from the BPF scheduler probes explains it.
  EXPECT_NE(stragglers[0].detail.find("off-CPU"), std::string::npos) << stragglers[0].detail;
  EXPECT_NE(stragglers[0].detail.find("waiting for a CPU"), std::string::npos) << stragglers[0].detail;
  EXPECT_TRUE(of_kind(deployment.findings(false), "hang").empty()) << dump(deployment, dir);
}

TEST_F(DetectE2E, CpuContentionOnOneRankMakesItTheOnlyStraggler) {
  deploy();
  expect_cpu_contention_straggler(*deployment, dir, cluster, 3);
}

// Fetches the collector's /metrics and runs Prometheus's own checker on it.
void expect_metrics_pass_promtool(const std::string& url, const TempDir& dir, const std::string& must_contain) {
  auto response = collector::http_request("GET", url, "", "", 3000);
  ASSERT_TRUE(response) << response.error().message;
  ASSERT_EQ(response->status, 200);
  EXPECT_NE(response->body.find(must_contain), std::string::npos) << response->body;
  std::ofstream(dir.file("metrics.txt")) << response->body;
  int rc = run_command("/usr/bin/promtool check metrics < " + dir.file("metrics.txt") + " > " +
                       dir.file("promtool.out") + " 2>&1");
  EXPECT_EQ(rc, 0) << slurp(dir.file("promtool.out"));
  EXPECT_EQ(slurp(dir.file("promtool.out")), "") << "promtool has remarks";
}

TEST_F(DetectE2E, StoppedRankIsNamedInAHangWithinTimeoutPlusTwoSeconds) {
  // With the outputs on: Prometheus metrics and a real Alertmanager.
  RealAlertmanager alertmanager;
  ASSERT_TRUE(alertmanager.ready()) << alertmanager.log();
  int metrics_port = free_port();
  DeploymentOptions options;
  options.collector_args = {"--metrics", "127.0.0.1:" + std::to_string(metrics_port), "--alertmanager",
                            alertmanager.url()};
  deploy(options);
  std::string metrics_url = "http://127.0.0.1:" + std::to_string(metrics_port) + "/metrics";

  JobOptions job;
  job.args = {"--steps", "100000", "--compute-iters", "2000000", "--bucket-elems", "1024"};
  auto ranks = launch_job(dir, cluster, job);
  ASSERT_TRUE(wait_progress(30)) << dump(*deployment, dir);
  const int victim = 2;
  uint64_t stopped_ns = SystemClock::read(CLOCK_REALTIME);
  ranks[victim].signal(SIGSTOP);

  std::vector<SeenFinding> hangs;
  ASSERT_TRUE(wait_for(
      [&] {
        hangs = of_kind(deployment->findings(true), "hang");
        return !hangs.empty();
      },
      std::chrono::seconds(30)))
      << dump(*deployment, dir);
  ASSERT_EQ(hangs.size(), 1u) << dump(*deployment, dir);
  EXPECT_EQ(hangs[0].ranks, std::vector<int32_t>{victim}) << hangs[0].detail;
  EXPECT_EQ(hangs[0].nodes, std::vector<std::string>{deployment->node_name(victim / 2)});
  EXPECT_NE(hangs[0].detail.find("stopped"), std::string::npos) << hangs[0].detail;
  double seconds = static_cast<double>(hangs[0].opened_ns - stopped_ns) / 1e9;
  EXPECT_LE(seconds, 2.0 + 2.0) << "hang timeout 2 s; found after " << seconds << " s\n" << hangs[0].detail << "\n"
                                << dump(*deployment, dir);
  RecordProperty("hang_detected_after_s", std::to_string(seconds));

  // The alert reaches Alertmanager, the metrics say so and pass promtool.
  std::string id = std::to_string(hangs[0].id);
  auto firing = [&] {
    for (const auto& alert : alertmanager.alerts())
      if (has_field(alert, "finding_id", id) && has_field(alert, "alertname", "RankscopeHang") &&
          has_field(alert, "state", "active"))
        return true;
    return false;
  };
  EXPECT_TRUE(wait_for(firing, std::chrono::seconds(10))) << alertmanager.log();
  wait_for([&] {  // the metrics follow within one evaluation
    auto r = collector::http_request("GET", metrics_url, "", "", 3000);
    return r && r->body.find("rankscope_findings_open{kind=\"hang\"} 1") != std::string::npos;
  }, std::chrono::seconds(5));
  expect_metrics_pass_promtool(metrics_url, dir, "rankscope_findings_open{kind=\"hang\"} 1");

  ranks[victim].signal(SIGCONT);
  EXPECT_TRUE(wait_for([&] { return of_kind(deployment->findings(true), "hang").empty(); }, std::chrono::seconds(15)))
      << "the hang resolves once the rank runs again\n" << dump(*deployment, dir);
  EXPECT_TRUE(wait_for([&] { return !firing(); }, std::chrono::seconds(10))) << "the alert resolves in Alertmanager";
}

TEST_F(DetectE2E, KilledRankIsNamedWithItsSignal) {
  deploy();
  JobOptions job;
  job.args = {"--steps", "100000", "--compute-iters", "2000000", "--bucket-elems", "1024"};
  auto ranks = launch_job(dir, cluster, job);
  ASSERT_TRUE(wait_progress(20)) << dump(*deployment, dir);
  const int victim = 1;
  ranks[victim].signal(SIGKILL);
  // The others wait for it forever (as with NCCL); the finding says why.
  std::vector<SeenFinding> hangs;
  ASSERT_TRUE(wait_for(
      [&] {
        hangs = of_kind(deployment->findings(true), "hang");
        return !hangs.empty() && hangs[0].detail.find("killed by signal 9 (SIGKILL)") != std::string::npos;
      },
      std::chrono::seconds(30)))
      << dump(*deployment, dir);
  EXPECT_EQ(hangs[0].ranks, std::vector<int32_t>{victim}) << hangs[0].detail;
}

TEST_F(DetectE2E, RankCallingADifferentCollectiveIsAMismatch) {
  deploy();
  JobOptions job;
  job.args = {"--steps", "50", "--compute-iters", "200000", "--bucket-elems", "1024"};
  job.rank_args[1] = {"--mismatch-at-step", "10"};
  auto ranks = launch_job(dir, cluster, job);
  // Reported as soon as two different calls are known (with two ranks that
  // is a tie: both named), then narrowed to the odd one out as the others
  // arrive.
  std::vector<SeenFinding> mismatches;
  ASSERT_TRUE(wait_for(
      [&] {
        mismatches = of_kind(deployment->findings(true), "mismatch");
        return !mismatches.empty() && mismatches[0].ranks == std::vector<int32_t>{1};
      },
      std::chrono::seconds(30)))
      << dump(*deployment, dir);
  ASSERT_EQ(mismatches.size(), 1u);
  EXPECT_EQ(mismatches[0].seq, 30) << "step 10, first of 3 buckets";
  EXPECT_NE(mismatches[0].summary.find("AllGather"), std::string::npos) << mismatches[0].summary;

  // fakenccl lets the ranks go on past the mismatched call: the finding
  // says so and stays open (the data may be corrupt), also once the job is
  // gone.
  ASSERT_TRUE(wait_for(
      [&] {
        auto open = of_kind(deployment->findings(true), "mismatch");
        return open.size() == 1 && open[0].detail.find("went on past this collective") != std::string::npos;
      },
      std::chrono::seconds(15)))
      << dump(*deployment, dir);
  for (auto& rank : ranks) rank.signal(SIGKILL);
  observe_for(std::chrono::seconds(4));  // a gone job's hangs resolve within a heartbeat and an evaluation
  ASSERT_EQ(of_kind(deployment->findings(true), "mismatch").size(), 1u) << dump(*deployment, dir);

  // An operator acknowledges it with the CLI: closed, and who did it is kept.
  std::string id = std::to_string(mismatches[0].id);
  std::string cli = "USER=e2e-operator " + bin_path("rankscope") + deployment->cli_flags() + "ack " + id + " --json > " +
                    dir.file("ack.json") + " 2>&1";
  ASSERT_EQ(run_command(cli), 0) << slurp(dir.file("ack.json"));
  EXPECT_NE(slurp(dir.file("ack.json")).find("\"acknowledged_by\":\"e2e-operator"), std::string::npos)
      << slurp(dir.file("ack.json"));
  EXPECT_TRUE(of_kind(deployment->findings(true), "mismatch").empty()) << dump(*deployment, dir);
  EXPECT_NE(run_command(bin_path("rankscope") + deployment->cli_flags() + "ack 999999 > " + dir.file("bad.txt") +
                        " 2>&1"),
            0);
  EXPECT_NE(slurp(dir.file("bad.txt")).find("no finding #999999"), std::string::npos) << slurp(dir.file("bad.txt"));
}

TEST_F(DetectE2E, NodeClock250msOffStillNamesTheRightStraggler) {
  const int64_t offset = 250'000'000;
  DeploymentOptions options;
  options.agent_args = [&](int node) {
    return node == 1 ? std::vector<std::string>{"--test-clock-offset-ns", std::to_string(offset)}
                     : std::vector<std::string>{};
  };
  deploy(options);
  // Enough probes for the fit.
  ASSERT_TRUE(wait_for(
      [&] {
        auto nodes = deployment->nodes();
        return nodes.size() == 2 && nodes[0].clock_uncertainty_ns < 1'000'000 && nodes[1].clock_uncertainty_ns < 1'000'000;
      },
      std::chrono::seconds(20)));
  auto nodes = deployment->nodes();
  ASSERT_EQ(nodes[1].node, deployment->node_name(1));
  EXPECT_NEAR(static_cast<double>(nodes[1].wall_clock_skew_ns), static_cast<double>(offset), 1e6)
      << "status shows node-1's clock 250 ms off, within 1 ms";
  EXPECT_NEAR(static_cast<double>(nodes[0].wall_clock_skew_ns), 0.0, 1e6);
  EXPECT_NEAR(static_cast<double>(nodes[0].clock_offset_ns - nodes[1].clock_offset_ns), static_cast<double>(offset), 1e6);
  // The straggler is on the skewed node; uncorrected, both its ranks would look 250 ms late.
  expect_cpu_contention_straggler(*deployment, dir, cluster, 3);
}

// A rank whose GPU slows down while its host issues on time: its kernels
// start late (NCCL's profiler plugin says when), the others' GPUs wait for
// it, and it is named as a straggler on the GPU side, alone.
TEST_F(DetectE2E, ASlowGpuWhoseHostIssuesOnTimeIsTheOneGpuSideStraggler) {
  deploy();
  constexpr int kVictim = 2;
  JobOptions job;
  job.args = {"--steps", "100000", "--compute-iters", "2000000", "--bucket-elems", "1024"};
  job.env = {{"NCCL_PROFILER_PLUGIN", kPlugin}};
  // Each of its GPU's work items (a step stages 3 buckets, reduces them and
  // copies nothing back: 6) starts 1 ms late, from its 50th step on: its
  // job's steps, ~8 ms alone, take ~1.5x as long.
  job.rank_env[kVictim] = {{"FAKECUDA_GPU_DELAY_US", "1000"}, {"FAKECUDA_GPU_DELAY_AFTER", "300"}};
  auto ranks = launch_job(dir, cluster, job);
  std::vector<SeenFinding> stragglers;
  bool found = wait_for(
      [&] {
        stragglers = of_kind(deployment->findings(true), "straggler");
        return !stragglers.empty();
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(found) << dump(*deployment, dir);
  observe_for(std::chrono::seconds(3));  // the others' chance to be (wrongly) flagged
  stragglers = of_kind(deployment->findings(false), "straggler");
  ASSERT_EQ(stragglers.size(), 1u) << dump(*deployment, dir);
  EXPECT_EQ(stragglers[0].ranks, std::vector<int32_t>{kVictim}) << stragglers[0].detail;
  EXPECT_NE(stragglers[0].detail.find("(GPU side)"), std::string::npos) << stragglers[0].detail;
  EXPECT_NE(stragglers[0].detail.find("on its GPU"), std::string::npos) << stragglers[0].detail;
  EXPECT_TRUE(of_kind(deployment->findings(false), "hang").empty()) << dump(*deployment, dir);
}

// A slow link: each transfer from rank 2 to rank 1 (on the other node)
// takes 1.5 ms longer on the network, from rank 2's 600th exchange on (~100
// steps), while every host and GPU is on time: the job's steps take about
// twice as long. The agents take no background sample of NCCL's proxy
// steps: the collector asks for them once the collectives' shortest kernel
// grows; the link is named from them, and nothing else is named.
TEST_F(DetectE2E, ASlowLinkIsNamedFromNcclsProxyStepsAskedForOnDemand) {
  // No background sampling: the agents ask for NCCL's proxy steps only
  // when the collector asks them to.
  const int metrics_port = free_port();
  DeploymentOptions options;
  options.collector_args = {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)};
  options.agent_args = [](int) { return std::vector<std::string>{"--proxy-detail-ms", "0"}; };
  deploy(options);
  JobOptions job;
  job.args = {"--steps", "100000", "--compute-iters", "2000000", "--bucket-elems", "1024"};
  job.env = {{"NCCL_PROFILER_PLUGIN", kPlugin}};
  job.rank_env[2] = {
      {"FAKECUDA_LINK_DELAY_US", "1500"}, {"FAKECUDA_LINK_PEER", "1"}, {"FAKECUDA_LINK_DELAY_AFTER", "600"}};
  auto ranks = launch_job(dir, cluster, job);
  std::vector<SeenFinding> links;
  bool found = wait_for(
      [&] {
        links = of_kind(deployment->findings(true), "slow_link");
        return !links.empty();
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(found) << dump(*deployment, dir);
  // Asked for because the collectives' shortest kernel grew (nothing else
  // had proxy steps to go on), and still asked for while the finding is open.
  EXPECT_GE(collector_metric(metrics_port, "rankscope_detail_requests_total{reason=\"rise\"}"), 1)
      << dump(*deployment, dir);
  EXPECT_GE(collector_metric(metrics_port, "rankscope_detail_comms"), 1) << dump(*deployment, dir);
  observe_for(std::chrono::seconds(3));  // the other links' chance to be (wrongly) named
  links = of_kind(deployment->findings(false), "slow_link");
  ASSERT_EQ(links.size(), 1u) << dump(*deployment, dir);
  EXPECT_EQ(links[0].ranks, (std::vector<int32_t>{2, 1})) << links[0].detail;
  EXPECT_NE(links[0].detail.find("rank 2 on " + deployment->node_name(1) + " -> rank 1 on " + deployment->node_name(0)),
            std::string::npos)
      << links[0].detail;
  EXPECT_NE(links[0].detail.find("link side"), std::string::npos) << links[0].detail;
  EXPECT_TRUE(of_kind(deployment->findings(false), "hang").empty()) << dump(*deployment, dir);
  EXPECT_TRUE(of_kind(deployment->findings(false), "straggler").empty()) << dump(*deployment, dir);
}

// A link that dies while every host and GPU is healthy: every rank issues
// the collective, every rank's kernels start and wait, and nothing moves.
// Host timing and kernel times say only "all inside, none finishes"; NCCL's
// proxy steps (on when the collective was enqueued) show rank 2's data for
// rank 1 handed to the network and never done, and the hang names that link.
TEST_F(DetectE2E, ALinkThatStopsMovingIsNamedInTheHang) {
  // Proxy steps always on, so that they are on when the link dies (NCCL
  // fixes a collective's events when it is enqueued: docs/gpu-timing.md).
  DeploymentOptions options;
  options.agent_args = [](int) {
    return std::vector<std::string>{"--proxy-detail-ms", "1000", "--proxy-detail-period-ms", "1000"};
  };
  auto hangs = gpu_fault_hang(options, 2, {{"FAKECUDA_LINK_STALL_FILE", dir.file("dead")}, {"FAKECUDA_LINK_PEER", "1"}},
                              dir.file("dead"));
  ASSERT_EQ(hangs.size(), 1u) << dump(*deployment, dir);
  EXPECT_EQ(hangs[0].ranks, (std::vector<int32_t>{2, 1})) << hangs[0].detail;
  EXPECT_NE(hangs[0].detail.find("rank 2 on " + deployment->node_name(1) + " handed its data for rank 1 on " +
                                 deployment->node_name(0)),
            std::string::npos)
      << hangs[0].detail;
  EXPECT_NE(hangs[0].detail.find("stopped moving"), std::string::npos) << hangs[0].detail;
  EXPECT_NE(hangs[0].detail.find("every process is alive"), std::string::npos) << hangs[0].detail;
  EXPECT_TRUE(of_kind(deployment->findings(false), "straggler").empty()) << dump(*deployment, dir);
}

// A rank whose GPU stops (a kernel that never finishes) while every host
// lives: every host issues the step's collectives and blocks in
// cudaStreamSynchronize. Host timing says only "all entered, none
// progresses"; its GPU never started the collective that the others'
// kernels started and wait in, and the hang names it.
TEST_F(DetectE2E, AHungGpuWithEveryHostAliveIsNamedInTheHang) {
  constexpr int kStuck = 1;
  auto hangs = gpu_fault_hang({}, kStuck, {{"FAKECUDA_GPU_HANG_FILE", dir.file("hang")}}, dir.file("hang"));
  ASSERT_EQ(hangs.size(), 1u) << dump(*deployment, dir);
  EXPECT_EQ(hangs[0].ranks, std::vector<int32_t>{kStuck}) << hangs[0].detail;
  EXPECT_NE(hangs[0].detail.find("never started its collective"), std::string::npos) << hangs[0].detail;
  EXPECT_NE(hangs[0].detail.find("every process is alive"), std::string::npos) << hangs[0].detail;
  EXPECT_TRUE(of_kind(deployment->findings(false), "straggler").empty()) << dump(*deployment, dir);
}

TEST_F(DetectE2E, HealthyJobYieldsNoFindingAtAll) {
  deploy();
  JobOptions job;
  job.args = {"--steps", "150", "--compute-iters", "1000000", "--bucket-elems", "4096", "--check"};
  job.env = {{"NCCL_PROFILER_PLUGIN", kPlugin}};  // its GPU side too
  auto ranks = launch_job(dir, cluster, job);
  for (int rank = 0; rank < kRanks; ++rank)
    ASSERT_EQ(ranks[rank].wait(std::chrono::seconds(120)), 0) << slurp(dir.file("rank" + std::to_string(rank) + ".log"));
  // Past the hang timeout after the job, so an idle end would have shown.
  observe_for(std::chrono::seconds(3));
  EXPECT_TRUE(deployment->findings(false).empty()) << dump(*deployment, dir);
}

}  // namespace
}  // namespace rankscope::testing
