// A copy of libnccl at a Python wheel's path, loaded with dlopen by a process
// started after the agent: the running agent finds it in the process's maps,
// probes it (once, by inode), and the job's collectives reach the collector
// from the communicator's creation on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

TEST(LateLibrary, AWheelCopyLoadedWithDlopenAfterTheAgentStartedIsTraced) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root";
  TempDir dir;
  std::string wheel_dir = dir.file("venv/lib/python3.11/site-packages/nvidia/nccl/lib");
  std::filesystem::create_directories(wheel_dir);
  std::string wheel = wheel_dir + "/libnccl.so.2";
  std::filesystem::copy_file(std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2", wheel);

  NetnsCluster cluster(1);
  ASSERT_TRUE(cluster.ok());
  TestDeployment deployment(dir, cluster, 1);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20)));
  std::string agent_log = dir.file("agent-0.log");
  ASSERT_EQ(slurp(agent_log).find(wheel), std::string::npos) << "nothing maps the copy yet";

  constexpr int kSteps = 25;
  SpawnOptions spawn;
  spawn.argv = {bin_path("rankscope-late-child"), wheel, dir.path(), std::to_string(kSteps)};
  spawn.netns = cluster.name(0);
  spawn.env = {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"RANKSCOPE_JOB_ID", "wheel-job"}};
  spawn.stdout_path = dir.file("child.log");
  Process child(spawn);
  ASSERT_TRUE(wait_for([&] { return access(dir.file("loaded").c_str(), F_OK) == 0; }, std::chrono::seconds(20)))
      << slurp(dir.file("child.log"));
  // The agent's scan finds the new mapping and probes the file.
  // (It opens the file through /proc/PID/root: "probing ... in /proc/PID/root/<path>".)
  auto probed = [&] { return slurp(agent_log).find("/root" + wheel) != std::string::npos; };
  ASSERT_TRUE(wait_for(probed, std::chrono::seconds(20)))
      << slurp(agent_log);
  FILE* attached = std::fopen(dir.file("attached").c_str(), "w");
  ASSERT_NE(attached, nullptr);
  std::fclose(attached);

  // The collector has the communicator as created (not "unknown") and every call.
  std::string seen;
  ASSERT_TRUE(wait_for(
      [&] {
        capnp::MallocMessageBuilder request;
        auto req = request.initRoot<proto::query::Request>();
        req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
        req.setJobs();
        bool done = false;
        auto result = deployment.client().ask(request, [&](proto::query::Reply::Reader reply) {
          for (auto job : reply.getJobs().getJobs()) {
            if (std::string(job.getJob().cStr()) != "wheel-job") continue;
            for (auto comm : job.getComms()) {
              if (comm.getRanks().size() != 1) continue;
              auto rank = comm.getRanks()[0];
              seen = "origin " + std::to_string(static_cast<int>(comm.getOrigin())) + ", " +
                     std::to_string(rank.getRecords()) + " records, pid " + std::to_string(rank.getPid());
              done = comm.getOrigin() == proto::wire::CommOrigin::INIT_RANK && rank.getRecords() == kSteps &&
                     rank.getPid() == static_cast<uint32_t>(child.pid());
            }
          }
        });
        return result && done;
      },
      std::chrono::seconds(30)))
      << seen << "\n" << slurp(agent_log) << slurp(dir.file("child.log"));
  FILE* exit_file = std::fopen(dir.file("exit").c_str(), "w");
  ASSERT_NE(exit_file, nullptr);
  std::fclose(exit_file);
  EXPECT_EQ(child.wait(std::chrono::seconds(20)), 0) << slurp(dir.file("child.log"));
}

}  // namespace
}  // namespace rankscope::testing
