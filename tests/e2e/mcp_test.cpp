// `rankscope mcp` as an assistant meets it: the official MCP client SDK
// (TypeScript, from npm: tests/mcp) starts it over stdio with the CLI's
// client key, against a live collector holding a straggler and a hang of a
// real job (fakenccl-train ranks in network namespaces, traced by two
// agents), and checks each tool's answer (tests/mcp/client.mjs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/format.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

constexpr int kRanks = 4, kNodes = 2, kSlowed = 3, kStopped = 1;
const char* kJob = "mcp-job";

std::string mcp_dir() { return std::string(RANKSCOPE_SOURCE_DIR) + "/tests/mcp"; }

TEST(McpE2E, TheSdkClientGetsTheStragglerAndTheHangFromEachTool) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
  // The SDK is a test dependency installed by scripts/install-deps.sh test:
  // without it this test fails rather than skips.
  ASSERT_TRUE(std::filesystem::exists(mcp_dir() + "/node_modules/@modelcontextprotocol/sdk/package.json"))
      << "the MCP client SDK is missing: run scripts/install-deps.sh test (npm ci in tests/mcp)";
  ASSERT_EQ(run_command("node --version > /dev/null 2>&1"), 0) << "node is missing (Node 20 runs the MCP SDK client)";
  auto controller = cpu_controller();
  ASSERT_TRUE(controller) << "no cpu controller in cgroup v1 or v2 on this machine";

  TempDir dir;
  NetnsCluster cluster{kNodes};
  ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  DeploymentOptions options;
  options.collector_args = {"--hang-timeout-s", "2"};
  TestDeployment deployment(dir, cluster, kNodes, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));

  auto ranks = launch_train_job(dir, cluster, kRanks, kJob,
                                {"--steps", "1000000", "--compute-iters", "2000000", "--bucket-elems", "1024"});
  auto dump = [&] {
    std::string out = "findings:\n";
    for (const auto& f : deployment.findings(false)) out += "  [" + f.kind + "] " + f.detail + "\n";
    return out;
  };
  ASSERT_TRUE(wait_for([&] { return deployment.min_active_progress() >= 40; }, std::chrono::seconds(60))) << dump();

  // A straggler: one rank held to 15% of a core by its cgroup's quota.
  CgroupTree tree(controller->root);
  std::string group = tree.make(unique_name("rankscope-mcp-slowed"));
  set_cpu_quota(*controller, group, 0.15);
  std::ofstream(group + "/cgroup.procs") << ranks[kSlowed].pid();
  auto found = [&](const std::string& kind, int rank) {
    for (const auto& f : deployment.findings(false))
      if (f.kind == kind && f.ranks == std::vector<int32_t>{rank}) return true;
    return false;
  };
  ASSERT_TRUE(wait_for([&] { return found("straggler", kSlowed); }, std::chrono::seconds(45))) << dump();
  // Then a hang: another rank stopped.
  ranks[kStopped].signal(SIGSTOP);
  ASSERT_TRUE(wait_for([&] { return found("hang", kStopped); }, std::chrono::seconds(30))) << dump();

  // The CLI's own flags: the collector, and this client's CurveZMQ keys.
  std::vector<std::string> cli_args;
  std::istringstream flags(deployment.cli_flags());
  for (std::string flag; flags >> flag;) cli_args.push_back(flag);
  std::string args_json = "[";
  for (const auto& a : cli_args) args_json += (args_json.size() > 1 ? "," : "") + json_quote(a);
  args_json += "]";
  std::string expected = "{\"job\":" + json_quote(kJob) + ",\"straggler\":" + std::to_string(kSlowed) +
                         ",\"hang\":" + std::to_string(kStopped) + ",\"nodes\":[" + json_quote(deployment.node_name(0)) +
                         "," + json_quote(deployment.node_name(1)) + "]}";
  std::string command = "cd '" + mcp_dir() + "' && node client.mjs '" + bin_path("rankscope") + "' '" + args_json +
                        "' '" + expected + "' > " + dir.file("mcp.out") + " 2>&1";
  int rc = run_command(command);
  EXPECT_EQ(rc, 0) << slurp(dir.file("mcp.out")) << dump();
  EXPECT_NE(slurp(dir.file("mcp.out")).find("every check held"), std::string::npos) << slurp(dir.file("mcp.out"));
  ranks[kStopped].signal(SIGCONT);
}

}  // namespace
}  // namespace rankscope::testing
