#include "tests/support/cluster.h"

namespace rankscope::testing {

TestDeployment::TestDeployment(const TempDir& dir, const NetnsCluster& cluster, int nodes,
                               const std::vector<std::string>& extra_agent_args)
    : dir_(dir), agent_port_(free_port()), query_port_(free_port()), client_(query_endpoint(), 3000) {
  SpawnOptions collector;
  collector.argv = {bin_path("rankscope-collector"),
                    "--listen",  "tcp://127.0.0.1:" + std::to_string(agent_port_),
                    "--query",   query_endpoint(),
                    "--db",      dir.file("db")};
  collector.stdout_path = dir.file("collector.log");
  collector_ = std::make_unique<Process>(collector);
  for (int node = 0; node < nodes; ++node) {
    SpawnOptions agent;
    agent.argv = {bin_path("rankscope-agent"),
                  "--collector", "tcp://127.0.0.1:" + std::to_string(agent_port_),
                  "--node",      node_name(node),
                  "--netns",     cluster.path(node),
                  "--nccl-lib",  std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2"};
    agent.argv.insert(agent.argv.end(), extra_agent_args.begin(), extra_agent_args.end());
    agent.stdout_path = dir.file("agent-" + std::to_string(node) + ".log");
    agents_.emplace_back(agent);
  }
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
