#pragma once
// A rankscope deployment for end-to-end tests: a real collector on loopback
// ports, real agents, each speaking for one simulated node (a network
// namespace), all real processes.
#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/harness.h"
#include "tests/support/keys.h"
#include "tools/cli/client.h"

namespace rankscope::testing {

struct DeploymentOptions {
  std::vector<std::string> collector_args;
  // Extra arguments for the agent of one node.
  std::function<std::vector<std::string>(int node)> agent_args;
  // A command that runs the agent of one node (`faketime -f +300s`), before its argv.
  std::function<std::vector<std::string>(int node)> agent_prefix;
  // Plaintext everywhere (collector, agents and client with --insecure);
  // by default each gets real CurveZMQ keys made in the test's folder.
  bool insecure = false;
  // The agents' --slurm-jobs-dir ("": a folder of the test's, see
  // TestDeployment::slurm_jobs_dir); a RealSlurm's Prolog writes to its own.
  std::string slurm_jobs_dir;
};

// A finding as the tests read it from the query service.
struct SeenFinding {
  uint64_t id = 0;
  std::string kind, job, summary, detail;
  int64_t seq = -1;
  std::vector<int32_t> ranks;
  std::vector<std::string> nodes;
  uint64_t opened_ns = 0, resolved_ns = 0;
};

struct SeenNode {
  std::string node;
  bool connected = false;
  int64_t clock_offset_ns = 0;
  int64_t wall_clock_skew_ns = 0;
  uint64_t clock_uncertainty_ns = 0;
};

class TestDeployment {
 public:
  // Starts the collector and one agent per node of `cluster`.
  TestDeployment(const TempDir& dir, const NetnsCluster& cluster, int nodes, const DeploymentOptions& options = {});
  // Agents in the host's network namespace, each scoped only by what
  // options.agent_args gives it (`--cgroup DIR`, `--pid N`...).
  TestDeployment(const TempDir& dir, int nodes, const DeploymentOptions& options);
  // Stops the agents as a node's service manager does (SIGTERM; killed if
  // one has not stopped within 10 s), then kills the collector.
  ~TestDeployment();
  TestDeployment(const TestDeployment&) = delete;
  TestDeployment& operator=(const TestDeployment&) = delete;
  std::vector<SeenFinding> findings(bool open_only);
  std::vector<SeenNode> nodes();
  // Lowest last sequence number over the ranks of every communicator (-1: none yet).
  int64_t min_progress();
  // The same over the communicators that carry collectives only (a world
  // communicator a job only splits from has none).
  int64_t min_active_progress();
  void stop_agent(int node) { agents_.at(node).signal(SIGKILL); }
  // SIGKILLs the collector (nothing flushed), then starts it again on the
  // same database and ports after `away`; its log goes on in collector.log.
  void kill_and_restart_collector(std::chrono::milliseconds away);
  // Waits until every agent is connected (true) or the deadline passes.
  bool wait_connected(std::chrono::milliseconds timeout);
  std::string query_endpoint() const { return "tcp://127.0.0.1:" + std::to_string(query_port_); }
  cli::QueryClient& client() { return client_; }
  std::string node_name(int node) const { return "node-" + std::to_string(node); }
  const std::string& log_dir() const { return dir_.path(); }
  // Where the agents read Slurm jobs' accounts (--slurm-jobs-dir), and the
  // shipped Prolog (deploy/slurm/rankscope-prolog.sh) run there for `job`, as
  // slurmd runs it at a job's start: true if it recorded the job.
  std::string slurm_jobs_dir() const { return slurm_jobs_dir_.empty() ? dir_.file("slurm-jobs") : slurm_jobs_dir_; }
  bool slurm_prolog(const std::string& job, const std::string& account);
  // Flags for the rankscope CLI: --collector, and its keys (or --insecure).
  std::string cli_flags() const;
  TestKeys& keys() { return keys_; }

 private:
  int64_t progress(bool active_only);
  void start(const NetnsCluster* cluster, int nodes, const DeploymentOptions& options);

  const TempDir& dir_;
  int agent_port_;
  int query_port_;
  std::unique_ptr<Process> collector_;
  SpawnOptions collector_spawn_;
  std::vector<Process> agents_;
  bool insecure_;
  std::string slurm_jobs_dir_;
  TestKeys keys_;
  cli::QueryClient client_;
};

// A fakenccl-train job: `ranks` ranks, two to a node of `cluster` (rank r
// in node r / 2), RANKSCOPE_JOB_ID `job`, `args` after its id file; each
// rank's output in dir/rank<r>.log.
std::vector<Process> launch_train_job(const TempDir& dir, const NetnsCluster& cluster, int ranks,
                                      const std::string& job, const std::vector<std::string>& args);

// One series of a collector's /metrics on 127.0.0.1:`port` (its full name
// and labels, as exposed); -1 when absent or unreachable.
double collector_metric(int port, const std::string& series);

}  // namespace rankscope::testing
