// Delivery through failures, all real: a 4-rank fakenccl-train job on two
// simulated nodes is traced by two agents (eBPF) while the collector, in a
// network namespace of its own, is SIGKILLed and restarted twice and its
// link is cut once. Afterwards the collector holds every collective each
// rank says it made, exactly once, call by call. And an agent killed while
// the collector was away sends what it spooled when it comes back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "common/format.h"
#include "proto/records.h"
#include "tests/support/harness.h"
#include "tests/support/made_calls.h"
#include "tests/support/keys.h"
#include "tools/cli/client.h"

namespace rankscope::testing {
namespace {

namespace query = proto::query;

struct StoredCall {
  uint64_t seq;
  uint8_t op, datatype;
  uint64_t count, bytes;
  std::string node;
};

// Runs a program inside a network namespace with nsenter: only the network
// changes (`ip netns exec` also remounts /sys, hiding the cgroup
// hierarchies the agent reads).
SpawnOptions in_netns(const std::string& netns, std::vector<std::string> argv, const std::string& log) {
  SpawnOptions spawn;
  spawn.argv = {"/usr/bin/nsenter", "--net=/run/netns/" + netns};
  spawn.argv.insert(spawn.argv.end(), argv.begin(), argv.end());
  spawn.stdout_path = log;
  return spawn;
}

class Delivery {
 public:
  Delivery(const TempDir& dir, const NetnsCluster& cluster, int collector_node)
      : dir_(dir),
        cluster_(cluster),
        collector_node_(collector_node),
        query_("ipc://" + dir.file("query.sock")),
        keys_(dir),
        client_(query_, 3000, keys_.client()) {}

  std::string agent_endpoint() const { return "tcp://" + cluster_.address(collector_node_) + ":7600"; }

  void start_collector() {
    std::vector<std::string> argv = {bin_path("rankscope-collector"), "--listen", agent_endpoint(), "--query", query_,
                                     "--db", dir_.file("db")};
    for (const auto& arg : keys_.collector_args()) argv.push_back(arg);
    collector_ = std::make_unique<Process>(in_netns(cluster_.name(collector_node_), argv,
                                                    dir_.file("collector-" + std::to_string(++collector_runs_) + ".log")));
  }
  void kill_collector() {
    collector_->signal(SIGKILL);
    EXPECT_EQ(collector_->wait(std::chrono::seconds(10)), 128 + SIGKILL);
    collector_.reset();
  }
  Process start_agent(int node) {
    std::string name = "node-" + std::to_string(node);
    std::vector<std::string> argv = {bin_path("rankscope-agent"), "--collector", agent_endpoint(), "--node", name,
                                     "--netns", cluster_.path(node), "--nccl-lib",
                                     std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2", "--spool-dir",
                                     dir_.file("spool")};
    for (const auto& arg : keys_.agent_args(name)) argv.push_back(arg);
    return Process(in_netns(cluster_.name(node), argv,
                            dir_.file("agent-" + std::to_string(node) + "-" + std::to_string(++agent_runs_) + ".log")));
  }
  // The collector's link to the bridge, down or up: the path between every agent and it.
  bool set_link(bool up) {
    return run_command("ip -n " + cluster_.switch_name() + " link set p" + std::to_string(collector_node_) +
                       (up ? " up" : " down")) == 0;
  }

  // Nodes connected now.
  size_t connected() {
    size_t n = 0;
    ask([](auto req) { req.setStatus(); },
        [&](query::Reply::Reader r) {
          for (auto node : r.getStatus().getNodes()) n += node.getConnected() ? 1 : 0;
        });
    return n;
  }
  // Records the collector counted per rank (comm members), summed; and the communicators it knows.
  uint64_t counted_records(std::vector<uint64_t>* comms = nullptr, int32_t* nranks = nullptr) {
    uint64_t total = 0;
    if (comms) comms->clear();
    ask([](auto req) { req.setJobs(); },
        [&](query::Reply::Reader r) {
          for (auto job : r.getJobs().getJobs())
            for (auto comm : job.getComms()) {
              if (comms) comms->push_back(comm.getCommHash());
              if (nranks) *nranks = comm.getNranks();
              for (auto rank : comm.getRanks()) total += rank.getRecords();
            }
        });
    return total;
  }
  // Every record stored for the communicator, by rank, from the timeline (the database itself).
  std::map<int, std::vector<StoredCall>> stored(uint64_t comm) {
    std::map<int, std::vector<StoredCall>> out;
    ask(
        [&](auto req) {
          auto timeline = req.initTimeline();
          timeline.setComm(hex64(comm));
          timeline.setLast(0);
        },
        [&](query::Reply::Reader r) {
          for (auto rec : r.getTimeline().getRecords()) {
            EXPECT_EQ(rec.getLane(), 0u);
            out[rec.getRank()].push_back(StoredCall{rec.getSeq(), rec.getOp(), rec.getDatatype(), rec.getCount(),
                                                    rec.getBytes(), rec.getNode()});
          }
        });
    return out;
  }
  std::string logs() {
    std::string text;
    for (int i = 1; i <= collector_runs_; ++i)
      text += "--- collector run " + std::to_string(i) + "\n" + slurp(dir_.file("collector-" + std::to_string(i) + ".log"));
    for (int node = 0; node < 2; ++node)
      for (int i = 1; i <= agent_runs_; ++i)
        text += slurp(dir_.file("agent-" + std::to_string(node) + "-" + std::to_string(i) + ".log"));
    return text;
  }
  cli::QueryClient& client() { return client_; }

  template <typename Fill, typename Read>
  bool ask(Fill fill, Read read) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<query::Request>();
    req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
    fill(req);
    return static_cast<bool>(client_.ask(request, read));
  }

 private:
  const TempDir& dir_;
  const NetnsCluster& cluster_;
  int collector_node_;
  std::string query_;
  TestKeys keys_;
  cli::QueryClient client_;
  std::unique_ptr<Process> collector_;
  int collector_runs_ = 0, agent_runs_ = 0;
};

std::vector<Process> start_job(const TempDir& dir, const NetnsCluster& cluster, int ranks, int steps, int compute) {
  std::vector<Process> job;
  for (int rank = 0; rank < ranks; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--steps", std::to_string(steps),
                  "--buckets", "3", "--bucket-elems", "1024", "--compute-iters", std::to_string(compute), "--check",
                  "--record", dir.file("rank" + std::to_string(rank) + ".calls")};
    spawn.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(ranks)},
                 {"LOCAL_RANK", std::to_string(rank % 2)}};
    spawn.netns = cluster.name(rank / 2);
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    job.emplace_back(spawn);
  }
  return job;
}

// What the ranks made against what the collector holds: the same calls, in
// order, each once; and the collector's own count agrees.
void expect_stored_exactly_once(const TempDir& dir, Delivery& d, int ranks) {
  std::vector<std::vector<MadeCall>> made(ranks);
  uint64_t total_made = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    made[rank] = read_made_calls(dir.file("rank" + std::to_string(rank) + ".calls"));
    ASSERT_FALSE(made[rank].empty()) << "rank " << rank << " recorded no call";
    total_made += made[rank].size();
  }
  std::vector<uint64_t> comms;
  uint64_t in_store = 0;
  bool complete = wait_for(
      [&] {
        if (d.counted_records(&comms) < total_made || comms.size() != 1) return false;
        in_store = 0;
        for (const auto& [rank, calls] : d.stored(comms[0])) in_store += calls.size();
        return in_store >= total_made;
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(complete) << "stored " << in_store << " of " << total_made << " calls\n" << d.logs();
  EXPECT_EQ(d.counted_records(), total_made) << "the collector counted some batch twice";

  auto stored = d.stored(comms[0]);
  ASSERT_EQ(stored.size(), static_cast<size_t>(ranks));
  for (int rank = 0; rank < ranks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto& calls = stored[rank];
    ASSERT_EQ(calls.size(), made[rank].size());
    for (size_t i = 0; i < calls.size(); ++i) {
      SCOPED_TRACE("call " + std::to_string(i));
      EXPECT_EQ(calls[i].seq, i) << "every call once, none missing";
      EXPECT_EQ(proto::op_name(calls[i].op), made[rank][i].op);
      EXPECT_EQ(calls[i].count, made[rank][i].count);
      EXPECT_EQ(proto::datatype_name(calls[i].datatype), made[rank][i].datatype);
      EXPECT_EQ(calls[i].bytes, made[rank][i].bytes);
      EXPECT_EQ(calls[i].node, "node-" + std::to_string(rank / 2));
      if (::testing::Test::HasFailure()) return;
    }
  }
  // Nothing was given up on the way.
  d.ask([](auto req) { req.setStatus(); },
        [&](query::Reply::Reader r) {
          for (auto node : r.getStatus().getNodes()) {
            EXPECT_EQ(node.getDrops().getSendQueueFull(), 0u) << node.getNode().cStr();
            EXPECT_EQ(node.getDrops().getLostRecords(), 0u) << node.getNode().cStr();
            EXPECT_EQ(node.getDrops().getRingbufFull(), 0u) << node.getNode().cStr();
          }
        });
}

TEST(Delivery, EveryCollectiveIsStoredOnceThroughTwoCollectorKillsAndACutLink) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
  constexpr int kRanks = 4, kCollectorNode = 2;
  TempDir dir;
  NetnsCluster cluster(3);  // nodes 0 and 1 run the job, node 2 the collector
  ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  Delivery d(dir, cluster, kCollectorNode);
  d.start_collector();
  std::vector<Process> agents;
  for (int node = 0; node < 2; ++node) agents.push_back(d.start_agent(node));
  ASSERT_TRUE(wait_for([&] { return d.connected() == 2; }, std::chrono::seconds(20))) << d.logs();

  // Long enough to outlast what follows on a loaded machine (about a minute on an idle one).
  auto job = start_job(dir, cluster, kRanks, 6000, 2'000'000);
  auto progress_beyond = [&](uint64_t records) {
    return wait_for([&] { return d.counted_records() > records; }, std::chrono::seconds(30));
  };
  ASSERT_TRUE(progress_beyond(0)) << d.logs();

  // 1. The link goes down; the collector dies while it is down and comes back; then the link.
  ASSERT_TRUE(d.set_link(false));
  observe_for(std::chrono::milliseconds(1500));
  d.kill_collector();
  d.start_collector();
  observe_for(std::chrono::milliseconds(2500));
  uint64_t before = d.counted_records();  // the new collector, its link down: what the database held
  ASSERT_TRUE(d.set_link(true));
  ASSERT_TRUE(progress_beyond(before)) << "nothing stored after the link came back\n" << d.logs();
  ASSERT_TRUE(wait_for([&] { return d.connected() == 2; }, std::chrono::seconds(20))) << d.logs();

  // 2. Killed again while batches flow; restarted after a while.
  observe_for(std::chrono::milliseconds(1000));
  d.kill_collector();
  observe_for(std::chrono::milliseconds(2000));
  d.start_collector();
  // It resumes with the communicator it knew: four ranks, before any new batch.
  int32_t nranks = 0;
  std::vector<uint64_t> comms;
  ASSERT_TRUE(wait_for([&] { return d.counted_records(&comms, &nranks) > 0; }, std::chrono::seconds(20)));
  EXPECT_EQ(comms.size(), 1u);
  EXPECT_EQ(nranks, kRanks);
  before = d.counted_records();
  ASSERT_TRUE(progress_beyond(before)) << d.logs();
  for (int rank = 0; rank < kRanks; ++rank)
    ASSERT_TRUE(job[rank].running()) << "the job ended before the second restart; give it more steps";

  for (int rank = 0; rank < kRanks; ++rank)
    ASSERT_EQ(job[rank].wait(std::chrono::seconds(300)), 0)
        << "rank " << rank << ": " << slurp(dir.file("rank" + std::to_string(rank) + ".log"));
  expect_stored_exactly_once(dir, d, kRanks);
}

TEST(Delivery, AnAgentKilledWhileTheCollectorIsAwaySendsItsSpoolWhenItComesBack) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
  constexpr int kRanks = 4, kCollectorNode = 2;
  TempDir dir;
  NetnsCluster cluster(3);
  ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  Delivery d(dir, cluster, kCollectorNode);
  std::vector<Process> agents;
  for (int node = 0; node < 2; ++node) agents.push_back(d.start_agent(node));
  // No collector yet: the agents attach and spool.
  ASSERT_TRUE(wait_for(
      [&] {
        return slurp(dir.file("agent-0-1.log")).find("probing") != std::string::npos &&
               slurp(dir.file("agent-1-2.log")).find("probing") != std::string::npos;
      },
      std::chrono::seconds(20)))
      << d.logs();
  auto job = start_job(dir, cluster, kRanks, 300, 200'000);
  for (int rank = 0; rank < kRanks; ++rank)
    ASSERT_EQ(job[rank].wait(std::chrono::seconds(120)), 0)
        << "rank " << rank << ": " << slurp(dir.file("rank" + std::to_string(rank) + ".log"));
  // Every batch is written as it is made (100 ms); then both agents die.
  observe_for(std::chrono::milliseconds(500));
  for (auto& agent : agents) {
    agent.signal(SIGKILL);
    agent.wait(std::chrono::seconds(10));
  }
  agents.clear();
  for (int node = 0; node < 2; ++node) agents.push_back(d.start_agent(node));
  d.start_collector();
  expect_stored_exactly_once(dir, d, kRanks);
  EXPECT_NE(slurp(dir.file("agent-0-3.log")).find("of an earlier run not acknowledged"), std::string::npos)
      << d.logs();
}

}  // namespace
}  // namespace rankscope::testing
