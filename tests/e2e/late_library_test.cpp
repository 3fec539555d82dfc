// Late arrivals, for real. A copy of libnccl at a Python wheel's path, loaded
// with dlopen by a process started after the agent: the running agent finds
// it in the process's maps, probes it (once, by inode), and the job's
// collectives reach the collector from the communicator's creation on. And
// an agent started into a job already busy calling NCCL: it records the
// calls from then on.
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

// An agent started after the job's communicator exists, while its rank calls
// NCCL tens of thousands of times a second: the probes go on while calls
// run, so a call can be entered with the entry probe in place and return
// before its return probe is. The agent records the later calls (marked as
// on a communicator it cannot match: its creation was before it), counts
// the half-seen calls as lost returns, and does not take every later call
// for one nested in a call that never ended (it did, and recorded nothing).
TEST(LateAttach, AnAgentStartedIntoABusyJobRecordsItsLaterCalls) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF needs root: run the suite as root";
  TempDir dir;
  SpawnOptions spawn;
  spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--steps", "100000000", "--buckets", "10",
                "--bucket-elems", "16", "--compute-iters", "30000", "--quiet"};
  spawn.env = {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"RANKSCOPE_JOB_ID", "late-job"}};
  spawn.stdout_path = dir.file("rank.log");
  Process job(spawn);
  ASSERT_TRUE(wait_for([&] { return access(dir.file("nccl.id").c_str(), F_OK) == 0; }, std::chrono::seconds(20)))
      << slurp(dir.file("rank.log"));
  observe_for(std::chrono::seconds(1));  // well into its loop

  DeploymentOptions options;
  options.agent_args = [&](int) { return std::vector<std::string>{"--pid", std::to_string(job.pid())}; };
  TestDeployment deployment(dir, 1, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("agent-0.log"));
  uint64_t records = 0, unmatched = 0, nested = 0, lost_returns = 0;
  auto read_status = [&] {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<proto::query::Request>();
    req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
    req.setStatus();
    return deployment.client().ask(request, [&](proto::query::Reply::Reader reply) {
      for (auto n : reply.getStatus().getNodes()) {
        records = n.getRecords();
        unmatched = n.getDrops().getUnknownComm();
        nested = n.getDrops().getNested();
        lost_returns = n.getDrops().getLostReturns();
      }
    });
  };
  bool flowing = wait_for([&] { return read_status() && records >= 20000; }, std::chrono::seconds(30));
  std::string context = std::to_string(records) + " records, " + std::to_string(unmatched) + " unmatched, " +
                        std::to_string(nested) + " nested, " + std::to_string(lost_returns) + " lost returns\n" +
                        slurp(dir.file("agent-0.log"));
  ASSERT_TRUE(flowing) << context;
  ASSERT_TRUE(job.running()) << slurp(dir.file("rank.log"));
  EXPECT_EQ(unmatched, records) << "every call is on the communicator made before the agent: " << context;
  EXPECT_LT(nested, 100u) << "fakenccl's calls do not nest: " << context;
  // One thread, about 25 probed functions: at most one half-seen call each.
  EXPECT_LE(lost_returns, 25u) << context;
}

}  // namespace
}  // namespace rankscope::testing
