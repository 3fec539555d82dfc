// An unprivileged user attacks the monitoring from a GPU node, for real: user
// `nobody`, in a Slurm-shaped cgroup of their own job, loads their own
// do-nothing libnccl.so.2 (tests/e2e/stand_in/nccl.cpp) with dlopen and
// drives it (rankscope-hostile-rank). The real agent of that node probes the
// library like any other and reports what the calls say; a real 4-rank job of
// another tenant runs across both nodes meanwhile. The attempts, each a
// finding of the security review (docs/operations.md, Threat model):
//   - growth: a communicator announced with 2 ranks, then again with 65,536
//     and a call of rank 60,000 (this crashed the collector);
//   - rebinding: the other job's communicator (its unique id) claimed as its
//     rank 0, with calls;
//   - ending: that communicator destroyed by the attacker, a non-member;
//   - forgery: the environment names the other job, its account and root.
// The collector stays up, the other job's communicator, members and calls go
// on untouched and it has no finding, the attacker's process is billed to its
// own job and uid, and the refused claims are counted in status and metrics.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "collector/alert/http.h"
#include "proto/records.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

constexpr int kNodes = 2;
constexpr int kRanks = 4;

struct Member {
  std::string node;
  uint32_t pid = 0;
  uint64_t records = 0;
  bool ended = false;
  std::string user, account;
};
struct SeenComm {
  std::string job;
  int32_t nranks = 0;
  std::map<int32_t, Member> members;
};

// The communicator `hash` as the collector knows it (nranks 0: unknown).
SeenComm comm_of(TestDeployment& deployment, uint64_t hash) {
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  req.setJobs();
  SeenComm seen;
  auto result = deployment.client().ask(request, [&](proto::query::Reply::Reader reply) {
    for (auto job : reply.getJobs().getJobs())
      for (auto comm : job.getComms()) {
        if (comm.getCommHash() != hash) continue;
        seen.job = job.getJob();
        seen.nranks = comm.getNranks();
        for (auto r : comm.getRanks())
          seen.members[r.getRank()] =
              Member{r.getNode(), r.getPid(), r.getRecords(), r.getEnded(), r.getUser(), r.getAccount()};
      }
  });
  EXPECT_TRUE(result) << result.error().message;
  return seen;
}

// Refused claims per node, from the status query.
std::map<std::string, uint64_t> refused_claims(TestDeployment& deployment) {
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  req.setStatus();
  std::map<std::string, uint64_t> out;
  auto result = deployment.client().ask(request, [&](proto::query::Reply::Reader reply) {
    for (auto n : reply.getStatus().getNodes()) out[n.getNode()] = n.getRefusedClaims();
  });
  EXPECT_TRUE(result) << result.error().message;
  return out;
}

uint64_t hash_of_id_file(const std::string& path) {
  std::string bytes = slurp(path);
  return bytes.size() < 128 ? 0 : proto::comm_hash_of_unique_id(reinterpret_cast<const uint8_t*>(bytes.data()), 128);
}

TEST(AdversaryE2E, AUsersOwnLibncclCannotCrashGrowRebindOrEndAnotherJobsCommunicator) {
  if (geteuid() != 0) GTEST_SKIP() << "cgroups, eBPF and network namespaces need root: run the suite as root";
  struct stat st {};
  ASSERT_EQ(stat((cgroup2_root() + "/cgroup.procs").c_str(), &st), 0) << "no cgroup v2 hierarchy at " << cgroup2_root();
  TempDir dir;
  NetnsCluster cluster(kNodes);
  ASSERT_TRUE(cluster.ok());
  int metrics_port = free_port();
  DeploymentOptions options;
  options.collector_args = {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)};
  TestDeployment deployment(dir, cluster, kNodes, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));

  // The other tenant's job: 4 ranks, 2 per node.
  std::string victim_job = unique_name("victim-");
  std::vector<Process> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--quiet", "--steps", "1000000",
                  "--compute-iters", "200000", "--bucket-elems", "256"};
    spawn.env = {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(kRanks)},
                 {"LOCAL_RANK", std::to_string(rank % 2)}, {"RANKSCOPE_JOB_ID", victim_job}};
    spawn.netns = cluster.name(rank / 2);
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  uint64_t victim = 0;
  SeenComm before;
  ASSERT_TRUE(wait_for(
      [&] {
        victim = hash_of_id_file(dir.file("nccl.id"));
        before = comm_of(deployment, victim);
        if (before.members.size() != kRanks) return false;
        for (const auto& [r, m] : before.members)
          if (m.records == 0) return false;
        return true;
      },
      std::chrono::seconds(60)))
      << slurp(dir.file("collector.log"));
  ASSERT_EQ(before.nranks, kRanks);
  ASSERT_EQ(before.members.at(0).node, deployment.node_name(0));

  // The attacker: user nobody on node 1, in a cgroup of their own Slurm job,
  // with their own library in a folder of their own.
  std::string user_dir = dir.file("user");
  std::filesystem::create_directories(user_dir + "/lib");
  std::string library = user_dir + "/lib/libnccl.so.2";
  std::filesystem::copy_file(std::string(RANKSCOPE_STAND_IN_DIR) + "/libnccl.so.2", library);
  std::filesystem::copy_file(dir.file("nccl.id"), user_dir + "/stolen.id");  // as if forged: the id hash is FNV
  ASSERT_EQ(chmod(dir.path().c_str(), 0711), 0);
  ASSERT_EQ(run_command("chown -R nobody '" + user_dir + "'"), 0);
  std::string attacker_job = std::to_string(getpid()) + "77";
  CgroupTree tree;
  std::string cgroup = tree.make(unique_name("rankscope-adversary-") + "/slurm/uid_65534/job_" + attacker_job + "/step_0");
  std::string steps =
      "init 2 0 fill:ab allreduce 0 1 init 65536 60000 fill:ab allreduce 1 1 "  // growth
      "init 4 0 file:" + user_dir + "/stolen.id allreduce 2 3 destroy 2";     // rebinding, then ending
  SpawnOptions spawn;
  spawn.argv = {"/bin/sh", "-c",
                "echo $$ > '" + cgroup + "/cgroup.procs' && exec ip netns exec " + cluster.name(1) +
                    " setpriv --reuid=nobody --regid=nogroup --clear-groups '" + bin_path("rankscope-hostile-rank") +
                    "' '" + library + "' '" + user_dir + "' " + steps};
  spawn.env = {{"SLURM_JOB_ID", victim_job}, {"SLURM_JOB_ACCOUNT", "victim-account"}, {"SLURM_JOB_USER", "root"},
               {"RANK", "0"}, {"WORLD_SIZE", "4"}};
  spawn.stdout_path = dir.file("attacker.log");
  Process attacker(spawn);
  ASSERT_TRUE(wait_for([&] { return access((user_dir + "/loaded").c_str(), F_OK) == 0; }, std::chrono::seconds(20)))
      << slurp(dir.file("attacker.log"));
  std::string agent_log = dir.file("agent-1.log");
  ASSERT_TRUE(wait_for([&] { return slurp(agent_log).find("/root" + library) != std::string::npos; },
                       std::chrono::seconds(20)))
      << slurp(agent_log);
  std::ofstream(user_dir + "/attached").close();
  ASSERT_TRUE(wait_for([&] { return access((user_dir + "/done").c_str(), F_OK) == 0; }, std::chrono::seconds(20)))
      << slurp(dir.file("attacker.log"));

  // Counted: the second size, rank 60,000's calls, the stolen rank's
  // announcement and calls, and the end by a non-member; node 0 did nothing.
  std::map<std::string, uint64_t> refused;
  ASSERT_TRUE(wait_for(
      [&] {
        refused = refused_claims(deployment);
        return refused[deployment.node_name(1)] >= 5;
      },
      std::chrono::seconds(20)))
      << "refused claims of node 1: " << refused[deployment.node_name(1)] << "\n" << slurp(dir.file("collector.log"));
  EXPECT_EQ(refused[deployment.node_name(0)], 0u);

  // The attacker's communicator kept its first size and its one rank, billed
  // to the cgroup's job and the kernel's uid, without the account the
  // environment named for another job.
  uint64_t grown = proto::comm_hash_of_unique_id(std::vector<uint8_t>(128, 0xab).data(), 128);
  SeenComm own = comm_of(deployment, grown);
  EXPECT_EQ(own.nranks, 2);
  ASSERT_EQ(own.members.size(), 1u);
  EXPECT_EQ(own.members.at(0).node, deployment.node_name(1));
  EXPECT_EQ(own.job, attacker_job);
  EXPECT_EQ(own.members.at(0).user, "nobody");
  EXPECT_EQ(own.members.at(0).account, "");

  // The other job goes on as it was: same size, same members, none ended,
  // its calls still counted, and no finding about it.
  ASSERT_TRUE(wait_for(
      [&] {
        SeenComm now = comm_of(deployment, victim);
        return now.members.size() == kRanks && now.members.at(0).records > before.members.at(0).records + 10;
      },
      std::chrono::seconds(20)));
  SeenComm after = comm_of(deployment, victim);
  EXPECT_EQ(after.nranks, kRanks);
  EXPECT_EQ(after.job, victim_job);
  for (const auto& [r, m] : before.members) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(after.members.count(r), 1u);
    EXPECT_EQ(after.members.at(r).node, m.node);
    EXPECT_EQ(after.members.at(r).pid, m.pid);
    EXPECT_FALSE(after.members.at(r).ended);
  }
  for (const auto& f : deployment.findings(false)) EXPECT_NE(f.job, victim_job) << f.summary;

  // The metrics say so too (exported at the collector's next evaluation).
  std::string series = "rankscope_node_refused_claims_total{node=\"" + deployment.node_name(1) + "\"} ";
  std::string body;
  EXPECT_TRUE(wait_for(
      [&] {
        auto scraped = collector::http_request("GET", "http://127.0.0.1:" + std::to_string(metrics_port) + "/metrics",
                                               "", "", 3000);
        body = scraped ? scraped->body : "";
        size_t at = body.find(series);
        return at != std::string::npos && std::stod(body.substr(at + series.size())) >= 5.0;
      },
      std::chrono::seconds(10)))
      << body;

  std::ofstream(user_dir + "/exit").close();
  EXPECT_EQ(attacker.wait(std::chrono::seconds(20)), 0) << slurp(dir.file("attacker.log"));
  for (auto& rank : ranks) EXPECT_TRUE(rank.running());
}

}  // namespace
}  // namespace rankscope::testing
