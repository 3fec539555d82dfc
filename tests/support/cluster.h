#pragma once
// A rankscope deployment for end-to-end tests: a real collector on loopback
// ports, real agents, each speaking for one simulated node (a network
// namespace), all real processes.
#include <memory>
#include <string>
#include <vector>

#include "tests/support/harness.h"
#include "tools/cli/client.h"

namespace rankscope::testing {

class TestDeployment {
 public:
  // Starts the collector and one agent per node of `cluster`.
  TestDeployment(const TempDir& dir, const NetnsCluster& cluster, int nodes,
                 const std::vector<std::string>& extra_agent_args = {});
  // Waits until every agent is connected (true) or the deadline passes.
  bool wait_connected(std::chrono::milliseconds timeout);
  std::string query_endpoint() const { return "tcp://127.0.0.1:" + std::to_string(query_port_); }
  cli::QueryClient& client() { return client_; }
  std::string node_name(int node) const { return "node-" + std::to_string(node); }
  const std::string& log_dir() const { return dir_.path(); }

 private:
  const TempDir& dir_;
  int agent_port_;
  int query_port_;
  std::unique_ptr<Process> collector_;
  std::vector<Process> agents_;
  cli::QueryClient client_;
};

}  // namespace rankscope::testing
