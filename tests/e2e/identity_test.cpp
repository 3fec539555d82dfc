// Identity from cgroups, for real: two ranks of one job run in cgroups made
// by the test, one shaped like Slurm's (job_<id>/step_<n>) and one like a
// Kubernetes pod's container (kubepods...pod<uid>...cri-containerd-<id>,
// whose annotations containerd keeps in a state folder made by the test),
// and the collector knows each rank's job, step, pod (uid, namespace, name)
// and container, and bills the pod's GPU time to its namespace.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

TEST(Identity, SlurmAndKubernetesCgroupsNameStepPodAndContainer) {
  if (geteuid() != 0) GTEST_SKIP() << "cgroups, eBPF and network namespaces need root: run the suite as root";
  struct stat st {};
  ASSERT_EQ(stat((cgroup2_root() + "/cgroup.procs").c_str(), &st), 0) << "no cgroup v2 hierarchy at " << cgroup2_root();
  TempDir dir;
  NetnsCluster cluster(1);
  ASSERT_TRUE(cluster.ok());
  std::string container(64, 'a');
  std::string ns = unique_name("ml-team-");
  std::string state = dir.file("state");
  std::filesystem::create_directories(state + "/run/containerd/io.containerd.runtime.v2.task/k8s.io/" + container);
  std::ofstream(state + "/run/containerd/io.containerd.runtime.v2.task/k8s.io/" + container + "/config.json")
      << R"({"ociVersion":"1.1.0","annotations":{"io.kubernetes.cri.container-type":"container",)"
      << R"("io.kubernetes.cri.sandbox-name":"trainer-0","io.kubernetes.cri.sandbox-namespace":")" << ns << R"("}})";
  DeploymentOptions options;
  options.agent_args = [&](int) { return std::vector<std::string>{"--container-state-root", state}; };
  TestDeployment deployment(dir, cluster, 1, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20)));

  std::string top = unique_name("rankscope-test-");
  CgroupTree tree;
  std::string slurm = tree.make(top + "/slurm/uid_0/job_4242/step_7");
  std::string pod = tree.make(top + "/kubepods.slice/kubepods-besteffort.slice/"
                                    "kubepods-besteffort-pod0123abcd_4567_89ab_cdef_0123456789ab.slice/cri-containerd-" +
                              container + ".scope");
  std::vector<Process> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    SpawnOptions spawn;
    // Into the cgroup first, then into the node's namespace (`ip netns exec`
    // mounts a sysfs of its own, without the cgroup tree), then the program:
    // one process throughout, its first NCCL call already in the cgroup.
    std::string cgroup = rank == 0 ? slurm : pod;
    spawn.argv = {"/bin/sh", "-c",
                  "echo $$ > '" + cgroup + "/cgroup.procs' && exec ip netns exec " + cluster.name(0) + " '" +
                      bin_path("fakenccl-train") + "' --id-file '" + dir.file("nccl.id") +
                      "' --steps 400 --compute-iters 200000 --bucket-elems 1024 --quiet"};
    spawn.env = {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(rank)},
                 {"CUDA_VISIBLE_DEVICES", "3,5"}};
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  std::string jobs;
  ASSERT_TRUE(wait_for(
      [&] {
        capnp::MallocMessageBuilder request;
        auto req = request.initRoot<proto::query::Request>();
        req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
        req.setJobs();
        bool both = false;
        auto result = deployment.client().ask(request, [&](proto::query::Reply::Reader reply) {
          for (auto job : reply.getJobs().getJobs())
            for (auto comm : job.getComms()) {
              if (comm.getRanks().size() != 2) continue;
              auto r0 = comm.getRanks()[0];
              auto r1 = comm.getRanks()[1];
              jobs = "job " + std::string(job.getJob().cStr()) + "; rank 0 step " + r0.getSlurmStep().cStr() +
                     " gpu " + r0.getGpu().cStr() + "; rank 1 pod " + r1.getPodUid().cStr() + " (" +
                     r1.getPodNamespace().cStr() + "/" + r1.getPodName().cStr() + ") container " +
                     r1.getContainerId().cStr() + " gpu " + r1.getGpu().cStr();
              both = true;
            }
        });
        return result && both;
      },
      std::chrono::seconds(30)))
      << slurp(dir.file("rank0.log")) << slurp(dir.file("agent-0.log"));
  EXPECT_NE(jobs.find("rank 0 step 7 gpu 3"), std::string::npos) << jobs;
  EXPECT_NE(jobs.find("rank 1 pod 0123abcd-4567-89ab-cdef-0123456789ab (" + ns + "/trainer-0) container " +
                      container + " gpu 5"),
            std::string::npos)
      << jobs;
  for (auto& rank : ranks) EXPECT_EQ(rank.wait(std::chrono::seconds(120)), 0);
  // The pod's GPU time is billed to its namespace; the Slurm rank's to no namespace.
  std::string cli = bin_path("rankscope") + deployment.cli_flags() + "report --by namespace --csv > " +
                    dir.file("report.csv") + " 2>&1";
  EXPECT_TRUE(wait_for([&] { return run_command(cli) == 0 && slurp(dir.file("report.csv")).find("\n" + ns + ",") != std::string::npos; },
                       std::chrono::seconds(30)))
      << slurp(dir.file("report.csv"));
  EXPECT_NE(slurp(dir.file("report.csv")).find("(unknown),"), std::string::npos) << slurp(dir.file("report.csv"));
}

}  // namespace
}  // namespace rankscope::testing
