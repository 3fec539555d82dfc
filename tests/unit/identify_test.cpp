// Identity from a fake /proc root, as launchers set it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "node-agent/identify.h"
#include "tests/support/harness.h"

namespace rankscope::agent {
namespace {

void write(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

std::string environ_of(std::initializer_list<std::string> entries) {
  std::string raw;
  for (const auto& e : entries) raw += e + '\0';
  return raw;
}

TEST(Identify, SlurmEnvironmentGivesJobRankAndAccount) {
  testing::TempDir root;
  write(root.file("31/stat"), "31 (python3 (x)) S 1 31 31 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 987654 1 2 3\n");
  write(root.file("31/status"), "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n");
  write(root.file("31/environ"),
        environ_of({"SLURM_JOB_ID=4711", "SLURM_PROCID=5", "SLURM_LOCALID=1", "SLURM_NTASKS=8",
                    "SLURM_JOB_ACCOUNT=physics", "SLURM_JOB_USER=alice", "CUDA_VISIBLE_DEVICES=2,3"}));
  auto id = read_identity(root.path(), 31);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->start_time, 987654u);
  EXPECT_EQ(id->job, "4711");
  EXPECT_EQ(id->rank, 5);
  EXPECT_EQ(id->local_rank, 1);
  EXPECT_EQ(id->world_size, 8);
  EXPECT_EQ(id->account, "physics");
  EXPECT_EQ(id->user, "alice");
  EXPECT_EQ(id->uid, 1000u);
  EXPECT_EQ(id->visible_devices, "2,3");
}

TEST(Identify, TorchrunVariablesWinOverSlurmOnes) {
  ProcessIdentity id;
  apply_environment(parse_environ(environ_of({"RANK=3", "SLURM_PROCID=0", "WORLD_SIZE=16", "LOCAL_RANK=3",
                                              "TORCHELASTIC_RUN_ID=run-9"})),
                    id);
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(id.world_size, 16);
  EXPECT_EQ(id.local_rank, 3);
  EXPECT_EQ(id.job, "run-9");
}

TEST(Identify, GarbageValuesAreIgnored) {
  ProcessIdentity id;
  apply_environment(parse_environ(environ_of({"RANK=three", "=x", "WORLD_SIZE=", "OMPI_COMM_WORLD_RANK=2"})), id);
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.world_size, -1);
}

TEST(Identify, VanishedProcessIsNotAnError) {
  testing::TempDir root;
  EXPECT_FALSE(read_identity(root.path(), 12345));
}

}  // namespace
}  // namespace rankscope::agent
