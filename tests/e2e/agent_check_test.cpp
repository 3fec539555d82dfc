// `rankscope-agent check`, run for real: what a new user sees on a node that
// is ready, and on one that is not.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/support/harness.h"
#include "tests/support/keys.h"

namespace rankscope::testing {
namespace {

// `rankscope-agent check` as node gpu-7 against a collector started with
// `collector_args` beside its ports and keys: its exit status and output.
std::pair<int, std::string> check_against(const TempDir& dir, TestKeys& keys, std::vector<std::string> collector_args) {
  int agent_port = free_port();
  SpawnOptions collector;
  collector.argv = {bin_path("rankscope-collector"), "--listen", "tcp://127.0.0.1:" + std::to_string(agent_port),
                    "--query", "tcp://127.0.0.1:" + std::to_string(free_port()), "--db", dir.file("db")};
  for (const auto& arg : keys.collector_args()) collector.argv.push_back(arg);
  collector.argv.insert(collector.argv.end(), collector_args.begin(), collector_args.end());
  collector.stdout_path = dir.file("collector.log");
  Process running(collector);

  SpawnOptions check;
  check.argv = {bin_path("rankscope-agent"),
                "check",
                "--collector",
                "tcp://127.0.0.1:" + std::to_string(agent_port),
                "--node",
                "gpu-7",
                "--nccl-lib",
                std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2"};
  for (const auto& arg : keys.agent_args("gpu-7")) check.argv.push_back(arg);
  check.stdout_path = dir.file("check.out");
  Process agent(check);
  int status = agent.wait(std::chrono::seconds(60));
  return {status, slurp(dir.file("check.out"))};
}

TEST(AgentCheck, ReadyNodeListsItsProbedLibraries) {
  if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  TempDir dir;
  TestKeys keys(dir);
  auto [status, out] = check_against(dir, keys, {});
  EXPECT_EQ(status, 0) << out;
  std::string fake = std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2";
  EXPECT_NE(out.find("ok    BPF programs  loaded and verified"), std::string::npos) << out;
  EXPECT_NE(out.find(fake + ": NCCL, 20 functions probed"), std::string::npos) << out;
  EXPECT_NE(out.find("libcudart.so.13: CUDA runtime, 4 functions probed"), std::string::npos) << out;
  EXPECT_NE(out.find("libc.so.6: C library, 1 function probed"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    host context  sched_switch"), std::string::npos) << out;
  EXPECT_NE(out.find("accepts node gpu-7"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    keys          CurveZMQ, public key"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    clock port    tcp://127.0.0.1:"), std::string::npos) << out;
  EXPECT_NE(out.find(": probes answered apart from batches (round trip"), std::string::npos) << out;
  EXPECT_NE(out.find("ready: this node can be traced"), std::string::npos) << out;
}

// A clock port the node cannot reach (here: bound on another loopback
// address than the one the agent reaches the collector at, as a firewall
// or a Service without it would leave it): said, with what to do, and not
// a problem (probes go on the agent's connection).
TEST(AgentCheck, AClockPortOutOfReachIsAWarningWithWhatToDo) {
  if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  TempDir dir;
  TestKeys keys(dir);
  const int clock_port = free_port();
  auto [status, out] = check_against(dir, keys, {"--clock-listen", "tcp://127.0.0.2:" + std::to_string(clock_port)});
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("warn  clock port    tcp://127.0.0.1:" + std::to_string(clock_port) + ": no answer within 3 s"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("-> open TCP port " + std::to_string(clock_port) + " from this node to the collector"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ready: this node can be traced"), std::string::npos) << out;
}

TEST(AgentCheck, ProblemsComeWithWhatToDo) {
  if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  TempDir dir;
  SpawnOptions check;
  check.argv = {bin_path("rankscope-agent"), "check", "--collector", "tcp://127.0.0.1:" + std::to_string(free_port()),
                "--nccl-lib", dir.file("no/such/libnccl.so.2"), "--key", dir.file("no/such/agent.key")};
  check.stdout_path = dir.file("check.out");
  Process agent(check);
  EXPECT_EQ(agent.wait(std::chrono::seconds(60)), 1);
  std::string out = slurp(dir.file("check.out"));
  EXPECT_NE(out.find("no such file"), std::string::npos) << out;
  EXPECT_NE(out.find("-> fix the --nccl-lib path"), std::string::npos) << out;
  EXPECT_NE(out.find("-> start rankscope-collector there"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot read key file " + dir.file("no/such/agent.key")), std::string::npos) << out;
  EXPECT_NE(out.find("-> make this node's key pair with `rankscope keygen --role agent"), std::string::npos) << out;
  EXPECT_NE(out.find("not ready: 3 problem(s)"), std::string::npos) << out;
}

// Each NCCL process in scope: whether rankscope's profiler plugin is loaded
// (and read), or why not. A 2-rank fakenccl job, rank 0 with the plugin,
// rank 1 without; no agent runs, so nobody reads rank 0's ring.
TEST(AgentCheck, SaysWhetherEachNcclProcessLoadedTheProfilerPlugin) {
  if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  TempDir dir;
  std::vector<Process> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--steps", "1000000", "--quiet"};
    spawn.env = {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(rank)}};
    if (rank == 0) spawn.env["NCCL_PROFILER_PLUGIN"] = RANKSCOPE_PROFILER_PLUGIN;
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  // The plugin makes its ring at the first communicator.
  const std::string fd_dir = "/proc/" + std::to_string(ranks[0].pid()) + "/fd";
  ASSERT_TRUE(wait_for(
      [&] {
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator(fd_dir, ec)) {
          std::error_code link_ec;
          if (std::filesystem::read_symlink(entry.path(), link_ec).string().find("rankscope-nccl-ring") !=
              std::string::npos)
            return true;
        }
        return false;
      },
      std::chrono::seconds(30)))
      << slurp(dir.file("rank0.log"));
  SpawnOptions check;
  check.argv = {bin_path("rankscope-agent"), "check", "--collector", "tcp://127.0.0.1:" + std::to_string(free_port()),
                "--insecure", "--pid", std::to_string(ranks[0].pid()), "--pid", std::to_string(ranks[1].pid())};
  check.stdout_path = dir.file("check.out");
  Process agent(check);
  agent.wait(std::chrono::seconds(60));
  std::string out = slurp(dir.file("check.out"));
  EXPECT_NE(out.find("process " + std::to_string(ranks[0].pid()) +
                     ": rankscope's NCCL profiler plugin is loaded; its ring is not read"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("process " + std::to_string(ranks[1].pid()) +
                     ": no profiler plugin (NCCL_PROFILER_PLUGIN is not set): host timing only"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace rankscope::testing
