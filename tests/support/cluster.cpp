#include "tests/support/cluster.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "collector/alert/http.h"

namespace rankscope::testing {

TestDeployment::TestDeployment(const TempDir& dir, const NetnsCluster& cluster, int nodes,
                               const DeploymentOptions& options)
    : dir_(dir),
      agent_port_(free_port()),
      query_port_(free_port()),
      insecure_(options.insecure),
      slurm_jobs_dir_(options.slurm_jobs_dir),
      keys_(dir),
      client_(query_endpoint(), 3000, options.insecure ? curve::ClientKeys{} : keys_.client()) {
  start(&cluster, nodes, options);
}

TestDeployment::TestDeployment(const TempDir& dir, int nodes, const DeploymentOptions& options)
    : dir_(dir),
      agent_port_(free_port()),
      query_port_(free_port()),
      insecure_(options.insecure),
      slurm_jobs_dir_(options.slurm_jobs_dir),
      keys_(dir),
      client_(query_endpoint(), 3000, options.insecure ? curve::ClientKeys{} : keys_.client()) {
  start(nullptr, nodes, options);
}

TestDeployment::~TestDeployment() {
  // All at once: each closes its uprobe links as it stops.
  for (auto& agent : agents_) agent.signal(SIGTERM);
  for (auto& agent : agents_) agent.wait(std::chrono::seconds(10));
}

void TestDeployment::start(const NetnsCluster* cluster, int nodes, const DeploymentOptions& options) {
  SpawnOptions collector;
  collector.argv = {bin_path("rankscope-collector"),
                    "--listen",  "tcp://127.0.0.1:" + std::to_string(agent_port_),
                    "--query",   query_endpoint(),
                    "--db",      dir_.file("db")};
  auto security = insecure_ ? std::vector<std::string>{"--insecure"} : keys_.collector_args();
  collector.argv.insert(collector.argv.end(), security.begin(), security.end());
  collector.argv.insert(collector.argv.end(), options.collector_args.begin(), options.collector_args.end());
  collector.stdout_path = dir_.file("collector.log");
  collector_spawn_ = collector;
  collector_ = std::make_unique<Process>(collector);
  for (int node = 0; node < nodes; ++node) {
    SpawnOptions agent;
    agent.argv = {bin_path("rankscope-agent"),
                  "--collector", "tcp://127.0.0.1:" + std::to_string(agent_port_),
                  "--node",      node_name(node),
                  "--spool-dir", dir_.file("spool"),
                  "--slurm-jobs-dir", slurm_jobs_dir(),
                  "--nccl-lib",  std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2"};
    if (cluster) agent.argv.insert(agent.argv.end(), {"--netns", cluster->path(node)});
    auto keys = insecure_ ? std::vector<std::string>{"--insecure"} : keys_.agent_args(node_name(node));
    agent.argv.insert(agent.argv.end(), keys.begin(), keys.end());
    if (options.agent_args) {
      auto extra = options.agent_args(node);
      agent.argv.insert(agent.argv.end(), extra.begin(), extra.end());
    }
    if (options.agent_prefix) {
      auto prefix = options.agent_prefix(node);
      agent.argv.insert(agent.argv.begin(), prefix.begin(), prefix.end());
    }
    agent.stdout_path = dir_.file("agent-" + std::to_string(node) + ".log");
    agents_.emplace_back(agent);
  }
}

void TestDeployment::kill_and_restart_collector(std::chrono::milliseconds away) {
  collector_->signal(SIGKILL);
  collector_->wait(std::chrono::seconds(10));
  collector_.reset();
  std::this_thread::sleep_for(away);
  // The first run's log is kept: the new one is written next to it, then
  // appended to it when this deployment's log is read.
  SpawnOptions again = collector_spawn_;
  again.stdout_path = dir_.file("collector-restarted.log");
  collector_ = std::make_unique<Process>(again);
}

std::string TestDeployment::cli_flags() const {
  std::string flags = " --collector " + query_endpoint();
  for (const auto& arg : insecure_ ? std::vector<std::string>{"--insecure"} : keys_.cli_args()) flags += " " + arg;
  return flags + " ";
}

bool TestDeployment::wait_connected(std::chrono::milliseconds timeout) {
  return wait_for(
      [&] {
        capnp::MallocMessageBuilder request;
        auto req = request.initRoot<proto::query::Request>();
        req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
        req.setStatus();
        size_t connected = 0;
        auto result = client_.ask(request, [&](proto::query::Reply::Reader reply) {
          for (auto node : reply.getStatus().getNodes()) connected += node.getConnected() ? 1 : 0;
        });
        return result && connected == agents_.size();
      },
      timeout);
}

}  // namespace rankscope::testing

namespace rankscope::testing {

std::vector<SeenFinding> TestDeployment::findings(bool open_only) {
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  req.initFindings().setOpenOnly(open_only);
  std::vector<SeenFinding> out;
  auto result = client_.ask(request, [&](proto::query::Reply::Reader reply) {
    for (auto f : reply.getFindings().getFindings()) {
      SeenFinding seen;
      seen.id = f.getId();
      seen.kind = f.getKind();
      seen.job = f.getJob();
      seen.summary = f.getSummary();
      seen.detail = f.getDetail();
      seen.seq = f.getSeq();
      for (auto r : f.getRanks()) seen.ranks.push_back(r);
      for (auto n : f.getNodes()) seen.nodes.emplace_back(n.cStr());
      seen.opened_ns = f.getOpenedNs();
      seen.resolved_ns = f.getResolvedNs();
      out.push_back(seen);
    }
  });
  if (!result) ADD_FAILURE() << "findings query failed: " << result.error().message;
  return out;
}

std::vector<SeenNode> TestDeployment::nodes() {
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  req.setStatus();
  std::vector<SeenNode> out;
  auto result = client_.ask(request, [&](proto::query::Reply::Reader reply) {
    for (auto n : reply.getStatus().getNodes())
      out.push_back(SeenNode{n.getNode(), n.getConnected(), n.getClockOffsetNs(), n.getWallClockSkewNs(),
                             n.getClockUncertaintyNs()});
  });
  if (!result) ADD_FAILURE() << "status query failed: " << result.error().message;
  return out;
}

int64_t TestDeployment::progress(bool active_only) {
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  req.setJobs();
  int64_t lowest = INT64_MAX;
  bool any = false;
  auto result = client_.ask(request, [&](proto::query::Reply::Reader reply) {
    for (auto job : reply.getJobs().getJobs())
      for (auto comm : job.getComms()) {
        int64_t most = -1, least = INT64_MAX;
        for (auto rank : comm.getRanks()) {
          most = std::max(most, rank.getLastSeq());
          least = std::min(least, rank.getLastSeq());
          any = true;
        }
        if (active_only && most < 0) continue;
        if (comm.getRanks().size() < static_cast<unsigned>(comm.getNranks())) least = -1;
        lowest = std::min(lowest, least);
      }
  });
  // No communicator counted (none known yet, or none with a collective
  // yet, when active_only): no progress, not INT64_MAX, which a wait for
  // "at least N collectives" would take as reached.
  return result && any && lowest != INT64_MAX ? lowest : -1;
}

bool TestDeployment::slurm_prolog(const std::string& job, const std::string& account) {
  // The shipped Prolog, run as slurmd runs it: as root, the job in its environment.
  std::string script = std::string(RANKSCOPE_SOURCE_DIR) + "/deploy/slurm/rankscope-prolog.sh";
  return run_command("env -i RANKSCOPE_SLURM_DIR='" + slurm_jobs_dir() + "' SLURM_JOB_ID='" + job +
                     "' SLURM_JOB_ACCOUNT='" + account + "' /bin/sh '" + script + "'") == 0 &&
         std::filesystem::exists(slurm_jobs_dir() + "/" + job);
}

int64_t TestDeployment::min_progress() { return progress(false); }
int64_t TestDeployment::min_active_progress() { return progress(true); }

std::vector<Process> launch_train_job(const TempDir& dir, const NetnsCluster& cluster, int ranks,
                                      const std::string& job, const std::vector<std::string>& args) {
  std::vector<Process> out;
  for (int rank = 0; rank < ranks; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--quiet"};
    spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
    spawn.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(ranks)},
                 {"LOCAL_RANK", std::to_string(rank % 2)},
                 {"RANKSCOPE_JOB_ID", job}};
    spawn.netns = cluster.name(rank / 2);
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    out.emplace_back(spawn);
  }
  return out;
}

double collector_metric(int port, const std::string& series) {
  auto response = collector::http_request("GET", "http://127.0.0.1:" + std::to_string(port) + "/metrics");
  const std::string line = series + " ";
  size_t at = response ? response->body.find("\n" + line) : std::string::npos;
  return at == std::string::npos ? -1 : std::stod(response->body.substr(at + 1 + line.size()));
}

}  // namespace rankscope::testing
