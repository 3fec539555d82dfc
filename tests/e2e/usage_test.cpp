// Usage, cost and export end to end, all real: fakenccl-train ranks in
// cgroups shaped like Slurm jobs, traced by an agent with eBPF, a collector
// keeping the usage ledger, the CLI asking for reports and a Perfetto trace.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "common/clock.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

namespace query = proto::query;

struct Row {
  std::string tenant, top_cause;
  double gpu_hours = 0, cpu_seconds = 0, waste = 0, caused = 0;
};
struct SeenReport {
  std::vector<Row> rows;
  std::vector<std::tuple<std::string, std::string, std::string, double>> causes;  // victim, cause, reason, GPU-h
  const Row* row(const std::string& tenant) const {
    for (const auto& r : rows)
      if (r.tenant == tenant) return &r;
    return nullptr;
  }
  std::string text() const {
    std::string out;
    for (const auto& r : rows)
      out += r.tenant + ": gpu_h " + std::to_string(r.gpu_hours) + " cpu_s " + std::to_string(r.cpu_seconds) +
             " waste_h " + std::to_string(r.waste) + " caused_h " + std::to_string(r.caused) + " top cause " +
             r.top_cause + "\n";
    for (const auto& [v, c, why, h] : causes) out += "  " + v + " waited on " + c + " (" + why + "): " + std::to_string(h) + "\n";
    return out;
  }
};

SeenReport ask_report(TestDeployment& deployment, const std::string& by, const std::string& job = "") {
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<query::Request>();
  req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  auto q = req.initReport();
  q.setBy(by);
  q.setJob(job);
  SeenReport seen;
  auto result = deployment.client().ask(request, [&](query::Reply::Reader reply) {
    for (auto r : reply.getReport().getRows())
      seen.rows.push_back({r.getTenant(), r.getTopCause(), r.getGpuHours(), r.getCpuSeconds(), r.getWasteGpuHours(),
                           r.getCausedGpuHours()});
    for (auto c : reply.getReport().getCauses())
      seen.causes.emplace_back(c.getVictim(), c.getCause(), c.getReason(), c.getGpuHours());
  });
  EXPECT_TRUE(result) << result.error().message;
  return seen;
}

double now_s() { return static_cast<double>(SystemClock::read(CLOCK_REALTIME)) / 1e9; }

// cgroup v2 cpu.stat usage_usec, in seconds.
double cgroup_cpu_seconds(const std::string& cgroup) {
  std::string stat = slurp(cgroup + "/cpu.stat");
  size_t at = stat.find("usage_usec ");
  if (at == std::string::npos) return -1;
  return std::stod(stat.substr(at + 11)) / 1e6;
}

std::string in_cgroup(const std::string& cgroup, int cpu, const std::string& netns, const std::string& command) {
  return "echo $$ > '" + cgroup + "/cgroup.procs' && exec taskset -c " + std::to_string(cpu) + " ip netns exec " +
         netns + " " + command;
}

// One rank of a Slurm-shaped training job: fakenccl-train in `cgroup`,
// pinned to `cpu`, in the node's network namespace, holding one GPU (its
// rank), with the job, account and user srun would give it (the account is
// read from the job's Prolog record, TestDeployment::slurm_prolog).
struct SlurmRank {
  std::string cgroup, netns, job, account, user, id_file, log;
  int cpu = 0, rank = 0, world = 1;
};
SpawnOptions slurm_rank(const SlurmRank& r) {
  std::string train = "'" + bin_path("fakenccl-train") +
                      "' --steps 1000000 --compute-iters 2000000 --bucket-elems 1024 --quiet --id-file '" + r.id_file + "'";
  SpawnOptions spawn;
  spawn.argv = {"/bin/sh", "-c", in_cgroup(r.cgroup, r.cpu, r.netns, train)};
  spawn.env = {{"RANK", std::to_string(r.rank)}, {"WORLD_SIZE", std::to_string(r.world)},
               {"LOCAL_RANK", std::to_string(r.rank)}, {"CUDA_VISIBLE_DEVICES", std::to_string(r.rank)},
               {"SLURM_JOB_ID", r.job}, {"SLURM_JOB_ACCOUNT", r.account}, {"SLURM_JOB_USER", r.user}};
  spawn.stdout_path = r.log;
  return spawn;
}

// Two tenants on one host: job A (account A, two ranks, one GPU each) and job
// B (account B, one rank and a stress-ng CPU hog on A's second rank's CPU).
// A's rank 1 arrives late at every collective because B's hog takes its CPU:
// the ledger bills A for the GPU-hours its rank 0 spent waiting and names
// B's job (and account) as the cause; GPU-hours and CPU-seconds are what the
// test made, within 2%.
TEST(UsageE2E, NeighbourCpuHogIsBilledForTheStragglerItMakes) {
  if (geteuid() != 0) GTEST_SKIP() << "cgroups, eBPF and network namespaces need root: run the suite as root";
  struct stat st {};
  ASSERT_EQ(stat((cgroup2_root() + "/cgroup.procs").c_str(), &st), 0) << "no cgroup v2 hierarchy at " << cgroup2_root();
  TempDir dir;
  NetnsCluster cluster(1);
  ASSERT_TRUE(cluster.ok());
  TestDeployment deployment(dir, cluster, 1);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));

  std::string top = unique_name("rankscope-usage-");
  std::string job_a = std::to_string(getpid()) + "1", job_b = std::to_string(getpid()) + "2";
  std::string account_a = unique_name("acct-a-"), account_b = unique_name("acct-b-");
  // slurmd's Prolog records each job's account on the node (the ranks'
  // SLURM_JOB_ACCOUNT is their user's word, not taken).
  ASSERT_TRUE(deployment.slurm_prolog(job_a, account_a));
  ASSERT_TRUE(deployment.slurm_prolog(job_b, account_b));
  CgroupTree tree;
  std::string cgroup_a = tree.make(top + "/slurm/uid_0/job_" + job_a + "/step_0");
  std::string cgroup_b = tree.make(top + "/slurm/uid_0/job_" + job_b + "/step_0");

  std::vector<Process> ranks;
  std::vector<double> started;
  auto launch = [&](const std::string& cgroup, int cpu, const std::string& job, const std::string& account,
                    const std::string& user, int rank, int world, const std::string& id_file) {
    started.push_back(now_s());
    ranks.emplace_back(slurm_rank({cgroup, cluster.name(0), job, account, user, id_file,
                                   dir.file("job" + job + "-rank" + std::to_string(rank) + ".log"), cpu, rank, world}));
  };
  launch(cgroup_a, 0, job_a, account_a, "alice", 0, 2, dir.file("a.id"));
  launch(cgroup_a, 1, job_a, account_a, "alice", 1, 2, dir.file("a.id"));
  launch(cgroup_b, 1, job_b, account_b, "bob", 0, 1, dir.file("b.id"));
  SpawnOptions hog;
  hog.argv = {"/bin/sh", "-c",
              // In the node's network namespace: the agent of a simulated node
              // sees that node's cgroups' CPU use only (as on a real host, all).
              in_cgroup(cgroup_b, 1, cluster.name(0), "/usr/bin/stress-ng --cpu 4 --timeout 300s --quiet")};
  Process stress(hog);

  // Long enough that a heartbeat's worth of uncertainty at the end is well under 2%.
  observe_for(std::chrono::seconds(50));
  for (size_t i = 0; i < ranks.size(); ++i)
    ASSERT_TRUE(ranks[i].running()) << "rank " << i << " ended early:\n"
                                    << slurp(dir.file("job" + std::string(i < 2 ? job_a : job_b) + "-rank" +
                                                      std::to_string(i < 2 ? i : 0) + ".log"));
  std::vector<double> ended;
  for (auto& rank : ranks) {
    rank.signal(SIGKILL);
    ended.push_back(now_s());
  }
  for (auto& rank : ranks) rank.wait(std::chrono::seconds(10));
  stress.signal(SIGKILL);
  double expected_a = (ended[0] - started[0] + ended[1] - started[1]) / 3600;  // one GPU each
  double expected_b = (ended[2] - started[2]) / 3600;
  double cpu_a = cgroup_cpu_seconds(cgroup_a);
  ASSERT_GT(cpu_a, 1.0) << "job A used no CPU?";

  // The dead processes' last heartbeat, then the ledger's next flush.
  SeenReport by_job;
  auto settled = [&] {
    by_job = ask_report(deployment, "job");
    const Row* a = by_job.row(job_a);
    const Row* b = by_job.row(job_b);
    return a && b && std::abs(a->gpu_hours - expected_a) < 0.02 * expected_a &&
           std::abs(b->gpu_hours - expected_b) < 0.02 * expected_b && std::abs(a->cpu_seconds - cpu_a) < 0.02 * cpu_a;
  };
  bool ok = wait_for(settled, std::chrono::seconds(30));
  std::string context = "expected A " + std::to_string(expected_a) + " GPU-h, " + std::to_string(cpu_a) +
                        " CPU-s; B " + std::to_string(expected_b) + " GPU-h\n" + by_job.text() + "findings:\n";
  for (const auto& f : deployment.findings(false)) context += "  " + f.detail + "\n";
  const Row* a = by_job.row(job_a);
  const Row* b = by_job.row(job_b);
  ASSERT_NE(a, nullptr) << context;
  ASSERT_NE(b, nullptr) << context;
  EXPECT_TRUE(ok) << context;
  EXPECT_NEAR(a->gpu_hours, expected_a, 0.02 * expected_a) << context;
  EXPECT_NEAR(b->gpu_hours, expected_b, 0.02 * expected_b) << context;
  EXPECT_NEAR(a->cpu_seconds, cpu_a, 0.02 * cpu_a) << context;
  RecordProperty("gpu_hours_error_a", std::to_string((a->gpu_hours - expected_a) / expected_a));
  RecordProperty("cpu_seconds_error_a", std::to_string((a->cpu_seconds - cpu_a) / cpu_a));

  // A waited, and the waiting is owed to B's job: a CPU neighbour.
  EXPECT_GT(a->waste, 0) << context;
  EXPECT_EQ(a->top_cause, job_b) << context;
  EXPECT_GT(b->caused, 0) << context;
  bool named = false;
  for (const auto& [victim, cause, reason, hours] : by_job.causes)
    named |= victim == job_a && cause == job_b && reason == "cpu-neighbour" && hours > 0;
  EXPECT_TRUE(named) << context;
  // The same by account: B's rank says which account B is.
  SeenReport by_account = ask_report(deployment, "account");
  const Row* acct_a = by_account.row(account_a);
  ASSERT_NE(acct_a, nullptr) << by_account.text();
  EXPECT_EQ(acct_a->top_cause, account_b) << by_account.text();

  // The CLI prints it for people, as CSV and JSON, with costs.
  std::string cli = bin_path("rankscope") + deployment.cli_flags() + "report ";
  EXPECT_EQ(run_command(cli + "--by job --price-per-gpu-hour 2.5 > " + dir.file("report.txt") + " 2>&1"), 0);
  std::string table = slurp(dir.file("report.txt"));
  EXPECT_NE(table.find(job_a), std::string::npos) << table;
  EXPECT_NE(table.find("TOTAL"), std::string::npos) << table;
  EXPECT_NE(table.find("cpu-neighbour"), std::string::npos) << table;
  EXPECT_EQ(run_command(cli + "--by account --csv > " + dir.file("report.csv") + " 2>&1"), 0);
  EXPECT_NE(slurp(dir.file("report.csv")).find(account_a + ","), std::string::npos) << slurp(dir.file("report.csv"));
  EXPECT_EQ(run_command(cli + "--job " + job_a + " --json > " + dir.file("bill.json") + " 2>&1"), 0);
  EXPECT_EQ(run_command("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                        "assert d[\"job\"]==sys.argv[2] and d[\"total\"][\"waste_gpu_hours\"]>0' " +
                        dir.file("bill.json") + " " + job_a),
            0)
      << slurp(dir.file("bill.json"));
  std::cout << table;
}

// A job that runs while the collector is SIGKILLed and restarted: its
// GPU-hours and CPU-seconds are what it used, counted once (not again from
// its start by the new collector), and billed to its account after the
// restart too (not to "(unknown)": the agent tells the new collector who
// its processes are).
TEST(UsageE2E, AJobRunningAcrossACollectorKillIsBilledOnceToItsAccount) {
  if (geteuid() != 0) GTEST_SKIP() << "cgroups, eBPF and network namespaces need root: run the suite as root";
  struct stat st {};
  ASSERT_EQ(stat((cgroup2_root() + "/cgroup.procs").c_str(), &st), 0) << "no cgroup v2 hierarchy at " << cgroup2_root();
  TempDir dir;
  NetnsCluster cluster(1);
  ASSERT_TRUE(cluster.ok());
  TestDeployment deployment(dir, cluster, 1);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));

  std::string job = std::to_string(getpid()) + "3";
  std::string account = unique_name("acct-restart-");
  ASSERT_TRUE(deployment.slurm_prolog(job, account));
  CgroupTree tree;
  std::string cgroup = tree.make(unique_name("rankscope-usage-") + "/slurm/uid_0/job_" + job + "/step_0");
  std::vector<Process> ranks;
  std::vector<double> started;
  for (int rank = 0; rank < 2; ++rank) {
    started.push_back(now_s());
    ranks.emplace_back(slurm_rank({cgroup, cluster.name(0), job, account, "carol", dir.file("nccl.id"),
                                   dir.file("rank" + std::to_string(rank) + ".log"), rank, rank, 2}));
  }
  // Long enough for several ledger flushes before the kill, and after it.
  observe_for(std::chrono::seconds(22));
  deployment.kill_and_restart_collector(std::chrono::seconds(3));
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector-restarted.log"));
  observe_for(std::chrono::seconds(25));
  for (int rank = 0; rank < 2; ++rank)
    ASSERT_TRUE(ranks[rank].running()) << "rank " << rank << " ended early:\n" << slurp(dir.file("rank" + std::to_string(rank) + ".log"));
  std::vector<double> ended;
  for (auto& rank : ranks) {
    rank.signal(SIGKILL);
    ended.push_back(now_s());
  }
  for (auto& rank : ranks) rank.wait(std::chrono::seconds(10));
  double expected = (ended[0] - started[0] + ended[1] - started[1]) / 3600;  // one GPU each
  double cpu = cgroup_cpu_seconds(cgroup);
  ASSERT_GT(cpu, 1.0) << "the job used no CPU?";

  SeenReport by_account;
  auto settled = [&] {
    by_account = ask_report(deployment, "account");
    const Row* row = by_account.row(account);
    return row && std::abs(row->gpu_hours - expected) < 0.02 * expected && std::abs(row->cpu_seconds - cpu) < 0.02 * cpu;
  };
  bool ok = wait_for(settled, std::chrono::seconds(30));
  std::string context = "expected " + std::to_string(expected) + " GPU-h, " + std::to_string(cpu) + " CPU-s\n" +
                        by_account.text() + "--- collector log after the restart:\n" +
                        slurp(dir.file("collector-restarted.log"));
  const Row* row = by_account.row(account);
  ASSERT_NE(row, nullptr) << context;
  EXPECT_TRUE(ok) << context;
  EXPECT_NEAR(row->gpu_hours, expected, 0.02 * expected) << context;
  EXPECT_NEAR(row->cpu_seconds, cpu, 0.02 * cpu) << context;
  const Row* unknown = by_account.row("(unknown)");
  EXPECT_LT(unknown ? unknown->gpu_hours : 0.0, 0.01 * expected) << context;
  RecordProperty("gpu_hours_error", std::to_string((row->gpu_hours - expected) / expected));
  RecordProperty("cpu_seconds_error", std::to_string((row->cpu_seconds - cpu) / cpu));
}

// The Perfetto export of a two-node job whose second node's agent runs under
// faketime (its wall clock 300 s ahead; the monotonic clock the events are
// stamped with is left alone, as on a node whose NTP is broken): valid JSON,
// one track per rank, each rank's slices in sequence order, and node 1's
// collectives on the cluster timeline with node 0's, not 300 s away.
TEST(UsageE2E, PerfettoExportPutsAFaketimeNodeOnTheClusterTimeline) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root";
  ASSERT_EQ(access("/usr/bin/faketime", X_OK), 0) << "faketime is missing: scripts/install-deps.sh installs it";
  // libfaketime keeps a shared-memory file and a semaphore per process in
  // /dev/shm and removes them only at a normal exit; the agent under it is
  // stopped by a signal. Those this test's processes made go with it.
  struct FaketimeFiles {
    std::set<std::string> before = list();
    static std::set<std::string> list() {
      std::set<std::string> out;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
        std::string name = e.path().filename().string();
        if (name.starts_with("faketime_shm_") || name.starts_with("sem.faketime_sem_")) out.insert(e.path().string());
      }
      return out;
    }
    ~FaketimeFiles() {
      for (const auto& f : list())
        if (!before.count(f)) std::filesystem::remove(f);
    }
  } faketime_files;
  TempDir dir;
  NetnsCluster cluster(2);
  ASSERT_TRUE(cluster.ok());
  DeploymentOptions options;
  options.agent_prefix = [](int node) {
    return node == 1 ? std::vector<std::string>{"/usr/bin/env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "/usr/bin/faketime",
                                                "-f", "+300s"}
                     : std::vector<std::string>{};
  };
  TestDeployment deployment(dir, cluster, 2, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("agent-1.log"));
  ASSERT_TRUE(wait_for(
      [&] {
        auto nodes = deployment.nodes();
        return nodes.size() == 2 && nodes[0].clock_uncertainty_ns < 1'000'000 && nodes[1].clock_uncertainty_ns < 1'000'000;
      },
      std::chrono::seconds(20)));
  auto nodes = deployment.nodes();
  EXPECT_NEAR(static_cast<double>(nodes[1].wall_clock_skew_ns) / 1e9, 300.0, 1.0)
      << "faketime did not move node-1's wall clock";

  const std::string job = unique_name("perfetto-");
  std::vector<Process> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--quiet", "--steps", "40",
                  "--compute-iters", "200000", "--bucket-elems", "1024"};
    spawn.env = {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", std::to_string(rank % 2)},
                 {"RANKSCOPE_JOB_ID", job}};
    spawn.netns = cluster.name(rank / 2);
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  for (int rank = 0; rank < 4; ++rank)
    ASSERT_EQ(ranks[rank].wait(std::chrono::seconds(120)), 0) << slurp(dir.file("rank" + std::to_string(rank) + ".log"));
  // Every rank's last records in.
  int64_t progress = -1;
  ASSERT_TRUE(wait_for(
      [&] {
        int64_t now = deployment.min_progress();
        bool still = now == progress && now > 0;
        progress = now;
        if (!still) observe_for(std::chrono::milliseconds(500));
        return still;
      },
      std::chrono::seconds(20)));

  std::string out = dir.file("trace.json");
  std::string cli = bin_path("rankscope") + deployment.cli_flags() + "export --format perfetto --job " +
                    job + " -o " + out;
  ASSERT_EQ(run_command(cli + " > " + dir.file("export.log") + " 2>&1"), 0) << slurp(dir.file("export.log"));
  std::string check = "python3 " + std::string(RANKSCOPE_SOURCE_DIR) + "/tests/e2e/check_perfetto.py " + out +
                      " --tracks 4 --nodes 2 --min-slices 100 --max-skew-ms 50 > " + dir.file("check.log") + " 2>&1";
  EXPECT_EQ(run_command(check), 0) << slurp(dir.file("check.log")) << slurp(dir.file("export.log"));
  std::cout << slurp(dir.file("export.log")) << slurp(dir.file("check.log"));
}

}  // namespace
}  // namespace rankscope::testing
