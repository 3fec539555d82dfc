// The shipped Slurm TaskProlog (deploy/slurm/rankscope-task-prolog.sh), run
// as slurmd runs it: /bin/sh with the task's environment only. It names
// rankscope's NCCL profiler plugin for jobs of the partitions the site
// lists, and for jobs that opt in; never for one that opts out or names
// another plugin. (e2e Slurm.* runs it under a real slurmd.)
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

class TaskPrologTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(plugin) << "not a real library: the script only checks that it is readable\n";
  }
  // The site's list, root's file with `mode`.
  void site_lists(const std::string& line, mode_t mode = 0644) {
    std::ofstream(conf) << "# rankscope TaskProlog settings\n" << line << "\n";
    ASSERT_EQ(chmod(conf.c_str(), mode), 0);
  }
  // What the script prints for a task with this environment.
  std::string task(const std::map<std::string, std::string>& env) {
    std::string command = "env -i PATH=/usr/bin:/bin RANKSCOPE_PROFILER_LIB=" + plugin +
                          " RANKSCOPE_TASK_PROLOG_CONF=" + conf;
    for (const auto& [name, value] : env) command += " " + name + "='" + value + "'";
    command += " /bin/sh " + std::string(RANKSCOPE_SOURCE_DIR) + "/deploy/slurm/rankscope-task-prolog.sh";
    std::string out;
    FILE* pipe = popen(("cd " + dir.path() + " && " + command).c_str(), "r");
    if (!pipe) return "popen failed";
    char buffer[256];
    while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
    EXPECT_EQ(pclose(pipe), 0) << "a TaskProlog never fails the task";
    return out;
  }

  TempDir dir;
  std::string plugin = dir.file("librankscope-nccl-profiler.so");
  std::string conf = dir.file("task-prolog.conf");
  std::string named = "export NCCL_PROFILER_PLUGIN=" + plugin + "\n";
};

TEST_F(TaskPrologTest, JobsOfTheListedPartitionsGetThePluginOthersOnlyIfTheyOptIn) {
  if (geteuid() != 0) GTEST_SKIP() << "the script reads only a root-owned list: run the suite as root (sudo make test)";
  site_lists("RANKSCOPE_PROFILER_PARTITIONS=\"gpu a100\"");
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}}), named);
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "gpu"}}), named);
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "cpu"}}), "") << "not listed";
  EXPECT_EQ(task({}), "") << "no partition known";
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "cpu"}, {"RANKSCOPE_NCCL_PROFILER", "1"}}), named) << "the job opts in";
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}, {"RANKSCOPE_NCCL_PROFILER", "0"}}), "") << "the job opts out";
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}, {"NCCL_PROFILER_PLUGIN", "/opt/nccl/inspector.so"}}), "")
      << "the job's own plugin wins";
}

TEST_F(TaskPrologTest, AStarListsEveryPartitionAndMatchesNoFile) {
  if (geteuid() != 0) GTEST_SKIP() << "the script reads only a root-owned list: run the suite as root (sudo make test)";
  site_lists("RANKSCOPE_PROFILER_PARTITIONS='*'");
  std::ofstream(dir.file("a100")).close();  // a file a glob of "*" in the task's folder would find
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "cpu"}}), named);
}

TEST_F(TaskPrologTest, AListAnyoneCanWriteOrNoListNamesNothingUnlessTheJobOptsIn) {
  if (geteuid() != 0) GTEST_SKIP() << "the script reads only a root-owned list: run the suite as root (sudo make test)";
  site_lists("RANKSCOPE_PROFILER_PARTITIONS=\"*\"", 0666);
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}}), "") << "a list others may write is not read";
  // A symbolic link to a list, even root's own: the file it names may
  // change under it (its folder may be anyone's).
  ASSERT_EQ(chmod(conf.c_str(), 0644), 0);
  std::string link = dir.file("linked.conf");
  ASSERT_EQ(symlink(conf.c_str(), link.c_str()), 0);
  std::swap(conf, link);
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}}), "") << "a list is not read through a symbolic link";
  std::swap(conf, link);
  unlink(link.c_str());
  unlink(conf.c_str());
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}}), "") << "no list: opt-in only";
  EXPECT_EQ(task({{"SLURM_JOB_PARTITION", "a100"}, {"RANKSCOPE_NCCL_PROFILER", "1"}}), named);
  unlink(plugin.c_str());
  EXPECT_EQ(task({{"RANKSCOPE_NCCL_PROFILER", "1"}}), "") << "the plugin is not on this node";
}

}  // namespace
}  // namespace rankscope::testing
