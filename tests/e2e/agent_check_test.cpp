// `rankscope-agent check`, run for real: what a new user sees on a node that
// is ready, and on one that is not.
#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/support/harness.h"
#include "tests/support/keys.h"

namespace rankscope::testing {
namespace {

TEST(AgentCheck, ReadyNodeListsItsProbedLibraries) {
  if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  TempDir dir;
  TestKeys keys(dir);
  int agent_port = free_port();
  SpawnOptions collector;
  collector.argv = {bin_path("rankscope-collector"), "--listen", "tcp://127.0.0.1:" + std::to_string(agent_port),
                    "--query", "tcp://127.0.0.1:" + std::to_string(free_port()), "--db", dir.file("db")};
  for (const auto& arg : keys.collector_args()) collector.argv.push_back(arg);
  collector.stdout_path = dir.file("collector.log");
  Process running(collector);

  SpawnOptions check;
  std::string fake = std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2";
  check.argv = {bin_path("rankscope-agent"), "check", "--collector", "tcp://127.0.0.1:" + std::to_string(agent_port),
                "--node", "gpu-7", "--nccl-lib", fake};
  for (const auto& arg : keys.agent_args("gpu-7")) check.argv.push_back(arg);
  check.stdout_path = dir.file("check.out");
  Process agent(check);
  EXPECT_EQ(agent.wait(std::chrono::seconds(60)), 0) << slurp(dir.file("check.out"));
  std::string out = slurp(dir.file("check.out"));
  EXPECT_NE(out.find("ok    BPF programs  loaded and verified"), std::string::npos) << out;
  EXPECT_NE(out.find(fake + ": NCCL, 20 functions probed"), std::string::npos) << out;
  EXPECT_NE(out.find("libcudart.so.13: CUDA runtime, 4 functions probed"), std::string::npos) << out;
  EXPECT_NE(out.find("libc.so.6: C library, 1 function probed"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    host context  sched_switch"), std::string::npos) << out;
  EXPECT_NE(out.find("accepts node gpu-7"), std::string::npos) << out;
  EXPECT_NE(out.find("ok    keys          CurveZMQ, public key"), std::string::npos) << out;
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

}  // namespace
}  // namespace rankscope::testing
