// Several collectors sharing a fleet through a real etcd cluster (Debian's
// etcd-server, started here on loopback): they register under leases and
// see each other; the CLI asked of any one of them answers for all and
// says which did not answer; a collector killed with SIGKILL leaves the
// fleet when its lease expires and placement gives its jobs to the
// survivors; a collector stopped cleanly leaves at once; etcd going away
// stops nothing, and its return is noticed. The agents are raw ZeroMQ
// DEALER sockets speaking the real protocol.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "collector/fleet/membership.h"
#include "common/format.h"
#include "common/placement.h"
#include "proto/codec.h"
#include "tests/support/alertmanager.h"
#include "tests/support/cluster.h"
#include "tests/support/etcd.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/keys.h"
#include "tests/support/made_calls.h"
#include "tests/support/wire.h"

namespace rankscope::testing {
namespace {

using nlohmann::json;

std::string endpoint(int port) {
  return "tcp://127.0.0.1:" + std::to_string(port);
}

// One collector of the fleet, on fresh ports, with a key pair of its own.
struct FleetCollector {
  FleetCollector(const TempDir& dir, TestKeys& keys, const std::string& id, const std::string& etcd, int ttl_s,
                 std::vector<std::string> extra = {})
      : id(id), agent_port(free_port()), query_port(free_port()) {
    key = keys.make(id, "collector", false);
    pub = key.substr(0, key.size() - 4) + ".pub";
    SpawnOptions spawn;
    spawn.argv = {bin_path("rankscope-collector"),
                  "--listen",
                  endpoint(agent_port),
                  "--query",
                  endpoint(query_port),
                  "--db",
                  dir.file("db-" + id),
                  "--key",
                  key,
                  "--allow",
                  keys.allow_dir()};
    if (!etcd.empty())
      spawn.argv.insert(spawn.argv.end(), {"--etcd", etcd, "--collector-id", id, "--advertise", "127.0.0.1",
                                           "--lease-ttl-s", std::to_string(ttl_s)});
    spawn.argv.insert(spawn.argv.end(), extra.begin(), extra.end());
    log = dir.file("collector-" + id + ".log");
    spawn.stdout_path = log;
    process = std::make_unique<Process>(spawn);
  }
  std::string id;
  int agent_port, query_port;
  std::string key, pub, log;
  std::unique_ptr<Process> process;
};

// Standard output of the rankscope CLI asked of `asked` (as the admitted
// client, waiting `timeout_ms` for each collector), parsed; null if not JSON.
json cli(TestKeys& keys, const FleetCollector& asked, const std::string& command, int timeout_ms = 1500) {
  std::string line = bin_path("rankscope") + " --collector " + endpoint(asked.query_port) + " --key " +
                     keys.cli_args()[1] + " --collector-key " + asked.pub + " --timeout-ms " +
                     std::to_string(timeout_ms) + " " + command + " --json 2>/dev/null";
  FILE* pipe = popen(line.c_str(), "r");
  if (!pipe) return nullptr;
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
  pclose(pipe);
  auto parsed = json::parse(text, nullptr, false);
  return parsed.is_discarded() ? json(nullptr) : parsed;
}

// What `rankscope fleet` says of collector `id`: its row, or null.
json fleet_row(const json& fleet, const std::string& id) {
  if (!fleet.is_object() || !fleet.contains("collectors")) return nullptr;
  for (const auto& row : fleet["collectors"])
    if (row.value("collector", "") == id) return row;
  return nullptr;
}

// Every listed collector answers and sees exactly `members` collectors.
bool settled(const json& fleet, size_t members) {
  if (!fleet.is_object() || !fleet.contains("collectors") || fleet["collectors"].size() != members) return false;
  for (const auto& row : fleet["collectors"])
    if (!row.value("answering", false) || !row.value("etcd_ok", false) || row.value("members_seen", 0u) != members)
      return false;
  return true;
}

// A node's agent as raw ZeroMQ: says hello, announces rank 0 of a
// communicator of 2 in `job`, then falls silent (a lost node, once
// --node-lost-timeout-s passes).
class SilentNode {
 public:
  SilentNode(TestKeys& keys, const std::string& node, const FleetCollector& to, const std::string& job, uint64_t comm)
      : socket_(context_, zmq::socket_type::dealer) {
    auto agent_key = keys.agent_args(node, true)[1];
    auto loaded = curve::load_client_keys(agent_key, to.pub);
    EXPECT_TRUE(loaded);
    socket_.set(zmq::sockopt::linger, 0);
    if (loaded) curve::apply(socket_, *loaded);
    socket_.connect(endpoint(to.agent_port));
    socket_.send(zmq::buffer(hello_message(node, 7)), zmq::send_flags::dontwait);
    AgentBatch batch;
    batch.instance = 7;
    batch.processes = {process(100, job)};
    batch.comms = {member(100, comm, 0, 2)};
    batch.clock_samples = {tight_clock_sample()};
    std::string bytes = batch.bytes();
    socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

// The collector placement gives `job` (communicator `comm`) among `ids`.
std::string owner_among(const std::string& job, uint64_t comm, const std::vector<std::string>& ids) {
  std::vector<fleet::Member> members;
  for (const auto& id : ids) members.push_back({id, "", "q", "", "", "", 0});
  return fleet::owner(fleet::placement_key(job, comm), members)->id;
}

// A job name whose communicator placement gives to `wanted` among `ids`.
std::string job_owned_by(const std::string& wanted, uint64_t comm, const std::vector<std::string>& ids) {
  for (int i = 0;; ++i) {
    std::string job = "train-" + std::to_string(i);
    if (owner_among(job, comm, ids) == wanted) return job;
  }
}

// The owner `rankscope jobs` gives communicator `comm` on collector `on`, or "".
std::string listed_owner(const json& jobs, const std::string& on, uint64_t comm) {
  if (!jobs.is_object() || !jobs.contains("collectors")) return "";
  for (const auto& c : jobs["collectors"]) {
    if (c.value("collector", "") != on) continue;
    for (const auto& job : c["jobs"])
      for (const auto& entry : job["comms"])
        if (entry.value("comm", "") == hex64(comm)) return entry.value("owner", "");
  }
  return "";
}

// One etcd member and two collectors, c1 (with `c1_extra`) and c2, with
// leases of `ttl_s`; `up` once c1 says both answer and see each other.
struct PairFleet {
  explicit PairFleet(int ttl_s, std::vector<std::string> c1_extra = {}) : keys(dir), etcd(1) {
    if (!etcd.ready()) return;
    c1 = std::make_unique<FleetCollector>(dir, keys, "c1", etcd.endpoints(), ttl_s, c1_extra);
    c2 = std::make_unique<FleetCollector>(dir, keys, "c2", etcd.endpoints(), ttl_s);
    up = wait_for([&] { return settled(fleet = cli(keys, *c1, "fleet"), 2); }, std::chrono::seconds(30));
  }
  auto parts() { return std::tie(keys, etcd, *c1, *c2, fleet); }
  TempDir dir;
  TestKeys keys;
  RealEtcd etcd;
  std::unique_ptr<FleetCollector> c1, c2;
  json fleet;
  bool up = false;
};

TEST(FleetE2E, ThreeCollectorsAnswerAsOneAndAKilledOneLosesItsJobsToTheSurvivors) {
  TempDir dir;
  TestKeys keys(dir);
  // The agents' keys are in the allow-list before the collectors start.
  for (const char* node : {"node-a", "node-b"}) keys.agent_args(node, true);
  RealEtcd etcd(3);
  ASSERT_TRUE(etcd.ready()) << etcd.log(0);
  constexpr int kTtlS = 3;
  const std::vector<std::string> ids = {"c1", "c2", "c3"};
  std::vector<std::unique_ptr<FleetCollector>> collectors;
  for (const auto& id : ids)
    collectors.push_back(std::make_unique<FleetCollector>(dir, keys, id, etcd.endpoints(), kTtlS,
                                                          std::vector<std::string>{"--node-lost-timeout-s", "3"}));
  FleetCollector& c1 = *collectors[0];
  FleetCollector& c2 = *collectors[1];
  FleetCollector& c3 = *collectors[2];
  json fleet;
  ASSERT_TRUE(wait_for([&] { return settled(fleet = cli(keys, c1, "fleet"), 3); }, std::chrono::seconds(30)))
      << fleet.dump() << "\n"
      << slurp(c1.log);

  // Two jobs on two collectors: a lost node in each. Asked of the third,
  // `findings` lists both, each with the collector that holds it.
  const uint64_t comm_a = 0xa11ce, comm_b = 0xb0b;
  const std::string job_a = job_owned_by("c2", comm_a, ids), job_b = "train-b";
  SilentNode node_a(keys, "node-a", c1, job_a, comm_a);
  SilentNode node_b(keys, "node-b", c3, job_b, comm_b);
  json findings;
  auto lost_on = [&](const std::string& id) {
    if (!findings.is_object()) return false;
    for (const auto& f : findings.value("findings", json::array()))
      if (f.value("kind", "") == "node_lost" && f.value("collector", "") == id) return true;
    return false;
  };
  ASSERT_TRUE(wait_for([&] { return (findings = cli(keys, c2, "findings")), lost_on("c1") && lost_on("c3"); },
                       std::chrono::seconds(30)))
      << findings.dump() << "\n"
      << cli(keys, c1, "jobs").dump() << "\n"
      << slurp(c1.log);
  EXPECT_TRUE(findings["unanswered"].empty()) << findings.dump();

  // An acknowledgement goes to the collector that holds the finding.
  uint64_t id_on_c3 = 0;
  for (const auto& f : findings["findings"])
    if (f.value("collector", "") == "c3") id_on_c3 = f.value("id", uint64_t{0});
  json acked = cli(keys, c1, "ack " + std::to_string(id_on_c3) + "@c3");
  EXPECT_TRUE(acked.is_object() && acked["acknowledged_by"].is_string()) << acked.dump();
  findings = cli(keys, c1, "findings");
  for (const auto& f : findings.value("findings", json::array()))
    EXPECT_EQ(f["acknowledged_by"].is_string(), f.value("collector", "") == "c3") << f.dump();

  // `jobs` asked of any collector: every collector's jobs, each
  // communicator with the collector placement gives it to.
  json jobs;
  ASSERT_TRUE(wait_for([&] { return listed_owner(jobs = cli(keys, c2, "jobs"), "c1", comm_a) == "c2"; },
                       std::chrono::seconds(10)))
      << jobs.dump();
  EXPECT_EQ(listed_owner(jobs, "c3", comm_b), owner_among(job_b, comm_b, ids)) << jobs.dump();

  // SIGKILL: c2 renews nothing; when its lease expires it leaves the fleet
  // and job A, which placement gave it, goes to the survivor that scores
  // next, within the lease's time and 5 s (the bound).
  auto killed_at = std::chrono::steady_clock::now();
  c2.process->signal(SIGKILL);
  const std::string survivor = owner_among(job_a, comm_a, {"c1", "c3"});
  ASSERT_TRUE(wait_for([&] { return listed_owner(jobs = cli(keys, c1, "jobs", 300), "c1", comm_a) == survivor; },
                       std::chrono::seconds(30)))
      << jobs.dump() << "\n"
      << slurp(c1.log);
  auto moved_after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
  std::printf("job %s moved from c2 to %s %lld ms after c2 was killed (lease %d s)\n", job_a.c_str(), survivor.c_str(),
              static_cast<long long>(moved_after.count()), kTtlS);
  EXPECT_LE(moved_after, std::chrono::seconds(kTtlS + 5));
  // The survivors see each other and no c2.
  ASSERT_TRUE(wait_for(
      [&] {
        fleet = cli(keys, c3, "fleet");
        auto row = fleet_row(fleet, "c3");
        return row.is_object() && row.value("members_seen", 0u) == 2 && fleet_row(fleet, "c2").is_null();
      },
      std::chrono::seconds(10)))
      << fleet.dump();

  // A collector registered but not answering is named, and the others answer.
  fleet::Member ghost{"ghost", "", endpoint(free_port()), "", "", "", 0};
  ASSERT_TRUE(etcd.put("/rankscope/collectors/ghost", fleet::member_json(ghost), 60));
  json status;
  ASSERT_TRUE(
      wait_for([&] { return (status = cli(keys, c1, "status"))["unanswered"].size() == 1; }, std::chrono::seconds(10)))
      << status.dump();
  EXPECT_EQ(status["unanswered"][0].value("collector", ""), "ghost");
  EXPECT_EQ(status["collectors"].size(), 2u) << status.dump();
}

TEST(FleetE2E, CollectorsGoOnWhileEtcdIsAwayAndRegisterAgainWhenItReturns) {
  const int metrics_port = free_port();
  PairFleet pair(2, {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(pair.up) << pair.fleet.dump() << pair.etcd.log(0);
  auto [keys, etcd, c1, c2, fleet] = pair.parts();

  etcd.kill(0);
  // Each says etcd is out of reach, keeps the fleet it last read, and answers.
  ASSERT_TRUE(wait_for(
      [&] {
        fleet = cli(keys, c1, "fleet");
        auto one = fleet_row(fleet, "c1"), two = fleet_row(fleet, "c2");
        return one.is_object() && two.is_object() && !one.value("etcd_ok", true) && !two.value("etcd_ok", true);
      },
      std::chrono::seconds(20)))
      << fleet.dump();
  EXPECT_EQ(fleet_row(fleet, "c1").value("members_seen", 0u), 2u) << fleet.dump();
  EXPECT_EQ(fleet_row(fleet, "c1").value("metrics", ""), "127.0.0.1:" + std::to_string(metrics_port)) << fleet.dump();
  EXPECT_TRUE(wait_for([&] { return collector_metric(metrics_port, "rankscope_fleet_etcd_up") == 0; },
                       std::chrono::seconds(5)));
  EXPECT_EQ(collector_metric(metrics_port, "rankscope_fleet_members"), 2);
  EXPECT_NE(fleet_row(fleet, "c1").value("etcd_error", "").find("no etcd endpoint answered"), std::string::npos)
      << fleet.dump();
  json status = cli(keys, c2, "status");
  EXPECT_EQ(status["collectors"].size(), 2u) << status.dump();

  // Back, on the same data: both are members again (their leases may have
  // expired meanwhile: then they registered again).
  etcd.start(0);
  ASSERT_TRUE(wait_for([&] { return settled(fleet = cli(keys, c2, "fleet"), 2); }, std::chrono::seconds(30)))
      << fleet.dump() << "\n"
      << slurp(c1.log);

  // c1's lease revoked from outside (as if it had expired): c1 registers again.
  auto admin = fleet::EtcdClient::make(etcd.endpoints());
  ASSERT_TRUE(admin);
  auto members = fleet::read_members(*admin, "/rankscope/");
  ASSERT_TRUE(members && members->size() == 2);
  ASSERT_TRUE(admin->revoke(members->front().lease));  // c1's: by id
  ASSERT_TRUE(wait_for(
      [&] {
        fleet = cli(keys, c1, "fleet");
        return settled(fleet, 2) && fleet_row(fleet, "c1").value("registrations", 0u) == 2;
      },
      std::chrono::seconds(20)))
      << fleet.dump() << "\n"
      << slurp(c1.log);
  EXPECT_TRUE(wait_for([&] { return collector_metric(metrics_port, "rankscope_fleet_registrations_total") == 2; },
                       std::chrono::seconds(5)));
  EXPECT_EQ(collector_metric(metrics_port, "rankscope_fleet_etcd_up"), 1);
}

TEST(FleetE2E, ACollectorStoppedCleanlyLeavesAtOnceAndOneWithoutEtcdIsAlone) {
  // A lease of a minute: only its revocation makes c2 leave sooner.
  PairFleet pair(60);
  ASSERT_TRUE(pair.up) << pair.fleet.dump() << pair.etcd.log(0);
  auto [keys, etcd, c1, c2, fleet] = pair.parts();
  c2.process->signal(SIGTERM);
  EXPECT_EQ(c2.process->wait(std::chrono::seconds(20)), 0) << slurp(c2.log);
  EXPECT_NE(slurp(c2.log).find("lease revoked"), std::string::npos) << slurp(c2.log);
  EXPECT_TRUE(wait_for([&] { return settled(fleet = cli(keys, c1, "fleet"), 1); }, std::chrono::seconds(20)))
      << fleet.dump();

  // A second collector with c1's id is refused, and c1 keeps its place.
  FleetCollector twin(pair.dir, keys, "twin", "", 0,
                      {"--etcd", etcd.endpoints(), "--collector-id", "c1", "--advertise", "127.0.0.1"});
  EXPECT_TRUE(wait_for([&] { return slurp(twin.log).find("is registered already") != std::string::npos; },
                       std::chrono::seconds(20)))
      << slurp(twin.log);
  fleet = cli(keys, c1, "fleet");
  EXPECT_TRUE(settled(fleet, 1)) << fleet.dump();
  EXPECT_EQ(fleet_row(fleet, "c1").value("queries", ""), endpoint(c1.query_port)) << fleet.dump();

  FleetCollector alone(pair.dir, keys, "alone", "", 0);
  ASSERT_TRUE(
      wait_for([&] { return fleet_row(fleet = cli(keys, alone, "fleet"), "").is_object(); }, std::chrono::seconds(20)))
      << fleet.dump() << slurp(alone.log);
  EXPECT_TRUE(fleet_row(fleet, "")["answering"].get<bool>());
  EXPECT_EQ(fleet_row(fleet, "").value("members_seen", 99u), 0u) << fleet.dump();
  json status = cli(keys, alone, "status");
  EXPECT_TRUE(status.contains("nodes")) << status.dump();  // alone: the plain reply, as before fleets
}

// A real agent (eBPF) for node `node` of `cluster`, sent to `home` only:
// the fleet's other members it learns from home's welcome.
Process fleet_agent(const TempDir& dir, TestKeys& keys, const NetnsCluster& cluster, int node,
                    const FleetCollector& home) {
  const std::string name = "node-" + std::to_string(node);
  SpawnOptions spawn;
  spawn.argv = {bin_path("rankscope-agent"),
                "--collector",
                endpoint(home.agent_port),
                "--node",
                name,
                "--netns",
                cluster.path(node),
                "--spool-dir",
                dir.file("spool"),
                "--nccl-lib",
                std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2"};
  auto key_args = keys.agent_args(name, true);
  key_args.back() = home.pub;  // --collector-key: home's own
  spawn.argv.insert(spawn.argv.end(), key_args.begin(), key_args.end());
  spawn.stdout_path = dir.file("agent-" + std::to_string(node) + ".log");
  return Process(spawn);
}

// A 4-rank fakenccl-train job `job`, two ranks to a node from `first_node`;
// each rank records the calls it made in DIR/JOB-rankR.calls.
std::vector<Process> fleet_job(const TempDir& dir, const NetnsCluster& cluster, const std::string& job,
                               int first_node) {
  std::vector<Process> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"),
                  "--id-file",
                  dir.file(job + ".id"),
                  "--quiet",
                  "--steps",
                  "1000000",
                  "--compute-iters",
                  "2000000",
                  "--bucket-elems",
                  "1024",
                  "--record",
                  dir.file(job + "-rank" + std::to_string(rank) + ".calls")};
    spawn.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", "4"},
                 {"LOCAL_RANK", std::to_string(rank % 2)},
                 {"RANKSCOPE_JOB_ID", job}};
    spawn.netns = cluster.name(first_node + rank / 2);
    spawn.stdout_path = dir.file(job + "-rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  return ranks;
}

// `job`'s communicator as collector `on` lists it in `jobs` (asked of any
// member), or null.
json comm_on(const json& jobs, const std::string& on, const std::string& job) {
  if (!jobs.is_object() || !jobs.contains("collectors")) return nullptr;
  for (const auto& c : jobs["collectors"]) {
    if (c.value("collector", "") != on) continue;
    for (const auto& j : c["jobs"])
      if (j.value("job", "") == job && !j["comms"].empty()) return j["comms"][0];
  }
  return nullptr;
}

// A text field of a JSON object ("" for anything else).
std::string field(const json& object, const char* name) {
  return object.is_object() ? object.value(name, "") : "";
}

// The lowest last sequence number over a listed communicator's ranks (-1: none or not all 4 yet).
int64_t min_seq(const json& comm) {
  if (!comm.is_object() || comm["ranks"].size() != 4) return -1;
  int64_t lowest = INT64_MAX;
  for (const auto& r : comm["ranks"]) lowest = std::min<int64_t>(lowest, r.value("last_seq", int64_t{-1}));
  return lowest;
}

// The open findings of `kind` in `job`, asked of `asked` (the whole fleet).
std::vector<json> open_findings(TestKeys& keys, const FleetCollector& asked, const std::string& kind,
                                const std::string& job) {
  std::vector<json> out;
  json findings = cli(keys, asked, "findings");
  if (!findings.is_object()) return out;
  for (const auto& f : findings.value("findings", json::array()))
    if (f.value("kind", "") == kind && f.value("job", "") == job && f.value("resolved_ns", uint64_t{1}) == 0)
      out.push_back(f);
  return out;
}

// Real agents on three network-namespace nodes follow the placement: each
// of two jobs goes to the collector that owns it (not to the agents'
// configured collectors), stragglers in both are found, and when the owner
// of one is SIGKILLed, its job moves to a survivor with every call its
// ranks made after the move stored there exactly once, and a hang there is
// found.
TEST(FleetE2E, AgentsSendEachJobToItsOwnerAndFollowItWhenItsCollectorIsKilled) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
  TempDir dir;
  TestKeys keys(dir);
  for (const char* node : {"node-0", "node-1", "node-2"}) keys.agent_args(node, true);
  NetnsCluster cluster(3);
  ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  RealEtcd etcd(3);
  ASSERT_TRUE(etcd.ready()) << etcd.log(0);
  RealAlertmanager alertmanager;
  ASSERT_TRUE(alertmanager.ready()) << alertmanager.log();
  constexpr int kTtlS = 3;
  const std::vector<std::string> ids = {"c1", "c2", "c3"};
  std::vector<std::unique_ptr<FleetCollector>> collectors;
  for (const auto& id : ids)
    collectors.push_back(std::make_unique<FleetCollector>(
        dir, keys, id, etcd.endpoints(), kTtlS,
        std::vector<std::string>{"--hang-timeout-s", "5", "--alertmanager", alertmanager.url()}));
  FleetCollector& c1 = *collectors[0];
  FleetCollector& c2 = *collectors[1];
  FleetCollector& c3 = *collectors[2];
  json fleet;
  ASSERT_TRUE(wait_for([&] { return settled(fleet = cli(keys, c1, "fleet"), 3); }, std::chrono::seconds(30)))
      << fleet.dump();
  // Each node's agent is given a different collector; each is told of the others.
  std::vector<Process> agents;
  for (int node = 0; node < 3; ++node) agents.push_back(fleet_agent(dir, keys, cluster, node, *collectors[node]));
  auto logs = [&] {
    std::string text;
    for (const auto& c : collectors) text += "--- collector " + c->id + "\n" + slurp(c->log);
    for (int node = 0; node < 3; ++node)
      text += "--- agent " + std::to_string(node) + "\n" + slurp(dir.file("agent-" + std::to_string(node) + ".log"));
    return text;
  };
  ASSERT_TRUE(wait_for(
      [&] {
        for (const auto& c : collectors) {
          json status = cli(keys, *c, "status");
          size_t connected = 0;
          for (const auto& col : status.value("collectors", json::array()))
            if (col.value("collector", "") == c->id)
              for (const auto& n : col["status"].value("nodes", json::array()))
                connected += n.value("connected", false);
          if (connected != 3) return false;
        }
        return true;
      },
      std::chrono::seconds(30)))
      << cli(keys, c1, "status").dump() << logs();

  // Job A on nodes 0-1, placed on c2; job B on nodes 1-2, placed on c3.
  const std::string job_a = job_owned_by("c2", 0, ids), job_b = job_owned_by("c3", 0, ids);
  auto ranks_a = fleet_job(dir, cluster, job_a, 0);
  auto ranks_b = fleet_job(dir, cluster, job_b, 1);
  json jobs;
  ASSERT_TRUE(wait_for(
      [&] {
        jobs = cli(keys, c1, "jobs");
        return min_seq(comm_on(jobs, "c2", job_a)) >= 40 && min_seq(comm_on(jobs, "c3", job_b)) >= 40;
      },
      std::chrono::seconds(60)))
      << jobs.dump() << logs();
  // Each job on its owner alone: no collector but the owner heard of it.
  EXPECT_TRUE(comm_on(jobs, "c1", job_a).is_null() && comm_on(jobs, "c3", job_a).is_null()) << jobs.dump();
  EXPECT_TRUE(comm_on(jobs, "c1", job_b).is_null() && comm_on(jobs, "c2", job_b).is_null()) << jobs.dump();
  EXPECT_EQ(field(comm_on(jobs, "c2", job_a), "owner"), "c2");

  // A straggler in each job: one rank of each held to 15% of a core by its cgroup's quota.
  auto controller = cpu_controller();
  ASSERT_TRUE(controller) << "no cpu controller in cgroup v1 or v2 on this machine";
  CgroupTree tree(controller->root);
  const int victim_a = 1, victim_b = 2;
  for (auto [ranks, victim] : {std::pair{&ranks_a, victim_a}, std::pair{&ranks_b, victim_b}}) {
    std::string group = tree.make(unique_name("rankscope-fleet-slowed"));
    set_cpu_quota(*controller, group, 0.15);
    std::ofstream(group + "/cgroup.procs") << (*ranks)[victim].pid();
  }
  std::vector<json> straggler_a, straggler_b;
  ASSERT_TRUE(wait_for(
      [&] {
        straggler_a = open_findings(keys, c1, "straggler", job_a);
        straggler_b = open_findings(keys, c1, "straggler", job_b);
        return !straggler_a.empty() && !straggler_b.empty();
      },
      std::chrono::seconds(60)))
      << cli(keys, c1, "findings").dump() << logs();
  EXPECT_EQ(straggler_a[0].value("collector", ""), "c2");
  EXPECT_EQ(straggler_a[0]["ranks"], json::array({victim_a})) << straggler_a[0].dump();
  EXPECT_EQ(straggler_b[0].value("collector", ""), "c3");
  EXPECT_EQ(straggler_b[0]["ranks"], json::array({victim_b})) << straggler_b[0].dump();
  // Its alert, from c2: the finding's id an annotation, not a label (in a fleet).
  auto straggler_alerts = [&] {
    std::vector<json> out;
    for (const auto& text : alertmanager.alerts()) {
      json alert = json::parse(text, nullptr, false);
      if (alert.is_object() && alert["labels"].value("alertname", "") == "RankscopeStraggler" &&
          alert["labels"].value("job", "") == job_a)
        out.push_back(alert);
    }
    return out;
  };
  std::vector<json> alerts;
  ASSERT_TRUE(wait_for([&] { return (alerts = straggler_alerts()).size() == 1; }, std::chrono::seconds(15)))
      << alertmanager.log();
  EXPECT_EQ(alerts[0]["annotations"].value("collector", ""), "c2") << alerts[0].dump();
  EXPECT_FALSE(alerts[0]["labels"].contains("finding_id")) << alerts[0].dump();

  // c2 is SIGKILLed while job A runs: within the lease and 5 s job A is the
  // survivor's, and its calls reach the survivor.
  std::vector<size_t> made_at_kill(4);
  for (int rank = 0; rank < 4; ++rank)
    made_at_kill[rank] = read_made_calls(dir.file(job_a + "-rank" + std::to_string(rank) + ".calls")).size();
  auto killed_at = std::chrono::steady_clock::now();
  c2.process->signal(SIGKILL);
  const std::string survivor = owner_among(job_a, 0, {"c1", "c3"});
  const FleetCollector& heir = survivor == "c1" ? c1 : c3;
  ASSERT_TRUE(wait_for(
      [&] { return field(comm_on(jobs = cli(keys, heir, "jobs", 300), survivor, job_a), "owner") == survivor; },
      std::chrono::seconds(30)))
      << jobs.dump() << logs();
  auto moved_after =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
  std::printf("job %s moved from c2 to %s %lld ms after c2 was killed (lease %d s)\n", job_a.c_str(), survivor.c_str(),
              static_cast<long long>(moved_after.count()), kTtlS);
  EXPECT_LE(moved_after, std::chrono::seconds(kTtlS + 5));
  const int64_t past_kill = static_cast<int64_t>(*std::max_element(made_at_kill.begin(), made_at_kill.end())) + 30;
  ASSERT_TRUE(wait_for([&] { return min_seq(comm_on(jobs = cli(keys, heir, "jobs"), survivor, job_a)) >= past_kill; },
                       std::chrono::seconds(60)))
      << jobs.dump() << logs();

  // The survivor judges job A's straggler again: the same alert, now told by it.
  ASSERT_TRUE(wait_for(
      [&] {
        for (const auto& f : open_findings(keys, heir, "straggler", job_a))
          if (f.value("collector", "") == survivor) return true;
        return false;
      },
      std::chrono::seconds(60)))
      << cli(keys, heir, "findings").dump() << logs();
  EXPECT_TRUE(wait_for(
      [&] {
        alerts = straggler_alerts();
        return alerts.size() == 1 && alerts[0]["annotations"].value("collector", "") == survivor;
      },
      std::chrono::seconds(15)))
      << "one alert for the straggler, whichever collector judges it\n"
      << json(alerts).dump();

  // A hang after the move: a rank of job A stopped. The survivor finds it.
  const int stopped = 3;
  ranks_a[stopped].signal(SIGSTOP);
  std::vector<json> hangs;
  ASSERT_TRUE(
      wait_for([&] { return !(hangs = open_findings(keys, c3, "hang", job_a)).empty(); }, std::chrono::seconds(30)))
      << cli(keys, c3, "findings").dump() << logs();
  EXPECT_EQ(hangs[0].value("collector", ""), survivor);
  EXPECT_EQ(hangs[0]["ranks"], json::array({stopped})) << hangs[0].dump();

  // Exactly once: job A stands still now (a rank stopped, the others wait
  // for it). On the survivor every rank's calls run without a gap or a
  // repeat from where it began (at the latest the first call made after the
  // kill) to the last call the rank made.
  const std::string comm = field(comm_on(jobs, survivor, job_a), "comm");
  std::vector<std::vector<MadeCall>> made(4);
  std::map<int, std::vector<int64_t>> stored;
  bool complete = wait_for(
      [&] {
        stored.clear();
        json timeline = cli(keys, heir, "timeline --comm " + comm + " --last 0");
        if (!timeline.is_object()) return false;
        for (const auto& r : timeline["records"])
          if (r.value("lane", 1) == 0) stored[r.value("rank", -1)].push_back(r.value("seq", int64_t{-1}));
        for (int rank = 0; rank < 4; ++rank) {
          made[rank] = read_made_calls(dir.file(job_a + "-rank" + std::to_string(rank) + ".calls"));
          // fakenccl-train writes a call's line before it makes the call: the stopped rank may
          // have been stopped between the two, its last line a call it never made.
          const int64_t last = stored[rank].empty() ? -2 : stored[rank].back();
          const auto lines = static_cast<int64_t>(made[rank].size());
          if (last + 1 != lines && !(rank == stopped && last + 2 == lines)) return false;
        }
        return true;
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(complete) << logs();
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto& seqs = stored[rank];
    std::printf("job %s rank %d: calls %lld-%lld stored on %s, %zu made at the kill, %zu in all\n", job_a.c_str(), rank,
                static_cast<long long>(seqs.front()), static_cast<long long>(seqs.back()), survivor.c_str(),
                made_at_kill[rank], made[rank].size());
    EXPECT_LE(seqs.front(), static_cast<int64_t>(made_at_kill[rank])) << "calls made after the kill are missing";
    for (size_t i = 1; i < seqs.size(); ++i)
      ASSERT_EQ(seqs[i], seqs[i - 1] + 1) << "a call stored twice, or one missing, after " << seqs[i - 1];
  }
  // The bill, asked of any collector: the survivors' parts, summed (c2,
  // gone from the fleet, is not asked: its part returns with it).
  json report = cli(keys, c1, "report --by job");
  ASSERT_TRUE(report.is_object()) << report.dump();
  std::map<std::string, double> billed;
  for (const auto& row : report["rows"]) billed[row.value("tenant", "")] = row.value("gpu_hours", 0.0);
  EXPECT_GT(billed[job_a], 0.0) << report.dump();  // by the survivor, since the move
  EXPECT_GT(billed[job_b], 0.0) << report.dump();  // by c3
  EXPECT_TRUE(report["unanswered"].empty()) << report.dump();
  json status = cli(keys, heir, "status");
  for (const auto& col : status.value("collectors", json::array()))
    for (const auto& n : col["status"].value("nodes", json::array())) {
      EXPECT_EQ(n["drops"].value("lost_records", 1u), 0u) << n.dump();
      EXPECT_EQ(n["drops"].value("send_queue_full", 1u), 0u) << n.dump();
    }
  ranks_a[stopped].signal(SIGCONT);
}

}  // namespace
}  // namespace rankscope::testing
