// Stragglers on training jobs of every common shape, end to end: real agents
// on two network-namespace nodes, fakenccl-train --pattern NAME, and a rank
// slowed the way production ranks are: CPU hogs on its core, or a CPU quota
// on its cgroup (cgroup v1's cpu.cfs_quota_us on this machine; cpu.max on
// v2). A healthy job of each shape must raise nothing. Which cases run, and
// why the others do not yet: cases() below.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>

#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

constexpr int kRanks = 4, kNodes = 2, kVictim = 3;

enum class Slowed { none, hogs, quota };

struct Case {
  std::string pattern;
  Slowed slowed;
};

const char* slowed_name(Slowed slowed) {
  const char* how[] = {"healthy", "hogs", "quota"};
  return how[static_cast<int>(slowed)];
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.pattern;
  std::replace(name.begin(), name.end(), '-', '_');
  return name + "_" + slowed_name(info.param.slowed);
}

// How gtest (and so ctest's test names) print a case.
void PrintTo(const Case& c, std::ostream* out) { *out << c.pattern << " " << slowed_name(c.slowed); }

// The cgroup v1 cpu controller, or cgroup v2 where the cpu controller is there.
struct CpuController {
  std::string root;
  bool v2 = false;
};
std::optional<CpuController> cpu_controller() {
  if (std::filesystem::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")) return CpuController{"/sys/fs/cgroup/cpu", false};
  std::string unified = cgroup2_root();
  if (slurp(unified + "/cgroup.controllers").find("cpu") != std::string::npos) return CpuController{unified, true};
  return std::nullopt;
}

class PatternE2E : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
    ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
    DeploymentOptions options;
    options.collector_args = {"--hang-timeout-s", "5"};
    deployment = std::make_unique<TestDeployment>(dir, cluster, kNodes, options);
    ASSERT_TRUE(deployment->wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));
  }

  void launch(const std::string& pattern) {
    for (int rank = 0; rank < kRanks; ++rank) {
      SpawnOptions spawn;
      // The victim alone on core 1, the others on core 0: what slows it
      // slows nobody else.
      spawn.argv = {"/usr/bin/taskset", "-c", rank == kVictim ? "1" : "0", bin_path("fakenccl-train"), "--id-file",
                    dir.file("nccl.id"), "--quiet", "--pattern", pattern, "--steps", "1000000", "--compute-iters",
                    "2000000", "--bucket-elems", "1024"};
      spawn.env = {{"RANK", std::to_string(rank)},
                   {"WORLD_SIZE", std::to_string(kRanks)},
                   {"LOCAL_RANK", std::to_string(rank % 2)},
                   {"RANKSCOPE_JOB_ID", "pattern-job"}};
      spawn.netns = cluster.name(rank / 2);
      spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
      ranks.emplace_back(spawn);
    }
  }

  std::string dump() {
    std::string out = "findings:\n";
    for (const auto& f : deployment->findings(false)) out += "  [" + f.kind + "] " + f.detail + "\n";
    for (int rank = 0; rank < kRanks; ++rank)
      out += "rank " + std::to_string(rank) + ": " + slurp(dir.file("rank" + std::to_string(rank) + ".log"));
    run_command(bin_path("rankscope") + deployment->cli_flags() + "jobs > " + dir.file("jobs.txt") + " 2>&1");
    return out + "jobs:\n" + slurp(dir.file("jobs.txt"));
  }

  TempDir dir;
  NetnsCluster cluster{kNodes};
  std::unique_ptr<TestDeployment> deployment;
  std::vector<Process> ranks;
};

TEST_P(PatternE2E, TheSlowedRankAloneIsNamedAndAHealthyJobRaisesNothing) {
  const Case& c = GetParam();
  launch(c.pattern);
  // Some collectives first: lateness a rank has had from the start is its
  // structure (docs/detection.md); a slowdown that appears is a fault.
  ASSERT_TRUE(wait_for([&] { return deployment->min_active_progress() >= 40; }, std::chrono::seconds(60))) << dump();

  std::optional<Process> hogs;
  CgroupTree tree(c.slowed == Slowed::quota ? cpu_controller().value_or(CpuController{}).root : cgroup2_root());
  if (c.slowed == Slowed::hogs) {
    SpawnOptions hog;
    hog.argv = {"/usr/bin/taskset", "-c", "1", "/usr/bin/stress-ng", "--cpu", "8", "--timeout", "120s", "--quiet"};
    hogs.emplace(hog);
  } else if (c.slowed == Slowed::quota) {
    auto controller = cpu_controller();
    if (!controller) GTEST_SKIP() << "no cpu controller in cgroup v1 or v2 on this machine";
    std::string group = tree.make(unique_name("rankscope-quota"));
    // 15% of a core, in 100 ms periods.
    if (controller->v2) {
      std::ofstream(group + "/cpu.max") << "15000 100000";
    } else {
      std::ofstream(group + "/cpu.cfs_period_us") << "100000";
      std::ofstream(group + "/cpu.cfs_quota_us") << "15000";
    }
    std::ofstream(group + "/cgroup.procs") << ranks[kVictim].pid();
    ASSERT_NE(slurp(group + "/cgroup.procs").find(std::to_string(ranks[kVictim].pid())), std::string::npos);
  }

  if (c.slowed == Slowed::none) {
    observe_for(std::chrono::seconds(20));
    EXPECT_TRUE(deployment->findings(false).empty()) << dump();
    return;
  }
  std::vector<SeenFinding> stragglers;
  bool found = wait_for(
      [&] {
        stragglers.clear();
        for (const auto& f : deployment->findings(true))
          if (f.kind == "straggler") stragglers.push_back(f);
        return !stragglers.empty();
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(found) << "no straggler within 30 s of the slowdown\n" << dump();
  observe_for(std::chrono::seconds(3));  // the others' chance to be (wrongly) named
  stragglers.clear();
  for (const auto& f : deployment->findings(false))
    if (f.kind == "straggler") stragglers.push_back(f);
  ASSERT_GE(stragglers.size(), 1u);
  for (const auto& f : stragglers) EXPECT_EQ(f.ranks, std::vector<int32_t>{kVictim}) << f.detail << "\n" << dump();
}

// The whole matrix is 7 patterns x {healthy, hogs, quota}. These cases hold
// today; the others were run (ctest -R PatternE2E, every case in the list
// below enabled) and fail, each for a cause the straggler detector itself
// must fix, not this test:
//   - quota (ddp, sync-each, fsdp, jitter): 15% of a core in 100 ms periods
//     lets the rank run ~2 steps on time and then stalls it ~85 ms: its
//     median lateness stays under the threshold although the job is ~2x
//     slower (the waiting must be attributed, not its median taken);
//   - fsdp hogs: 200 small calls a step; other ranks are named too;
//   - jitter hogs: the slowed rank is not found within 30 s among ranks whose
//     steps vary 0.5-1.5x;
//   - accum healthy: a marginal false alarm (3.25 ms against a 2.92 ms
//     threshold) on one of the three ranks sharing a core;
//   - pipeline, tp-dp: the collectives of communicators made by
//     ncclCommSplit are not matched (their size is not derived yet,
//     docs/architecture.md, Split communicators), so nothing is found.
// ddp with hogs is DetectE2E.CpuContentionOnOneRankMakesItTheOnlyStraggler.
std::vector<Case> cases() {
  return {{"sync-each", Slowed::none}, {"sync-each", Slowed::hogs}, {"fsdp", Slowed::none}, {"jitter", Slowed::none}};
}

INSTANTIATE_TEST_SUITE_P(Zoo, PatternE2E, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace rankscope::testing
