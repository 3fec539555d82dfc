// Writes the seed corpora of the fuzz targets: valid inputs made with the
// real encoders (samples.h), and the example config files of deploy/.
//   fuzz-make-seeds OUT_DIR SOURCE_DIR
// makes OUT_DIR/agent_message, OUT_DIR/query and OUT_DIR/config.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tests/fuzz/samples.h"

namespace fs = std::filesystem;
using namespace rankscope::fuzz;

namespace {
bool write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz-make-seeds OUT_DIR SOURCE_DIR\n";
    return 2;
  }
  const fs::path out = argv[1], source = argv[2];
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> corpora;

  // Node a's messages, node b's, and a commit round after one.
  auto a = [](const std::string& m) { return routed(0, m); };
  auto b = [](const std::string& m) { return routed(kNodeB, m); };
  auto a_commit = [](const std::string& m) { return routed(kCommitAfter, m); };
  auto b_commit = [](const std::string& m) { return routed(kNodeB | kCommitAfter, m); };
  corpora.push_back(
      {"agent_message",
       {
           {"batch", a(batch(1, 0, 0, 20))},
           {"batch-compact", a(compact_batch(1, 0, 0, 20))},
           {"batch-rank1", b(batch(1, 1, 0, 12))},
           {"session",
            join_messages({a(batch(1, 0, 0, 20)), a(clock_probe(2'100'000'000)), a(heartbeat(100, true, true)),
                           a(batch(2, 0, 20, 20)), a(heartbeat(100, true, false))})},
           // Both ranks on their own nodes: collectives complete, the ledger bills the wait.
           {"job", join_messages({a(batch(1, 0, 0, 20)), b_commit(batch(1, 1, 0, 20)), a(batch(2, 0, 20, 10)),
                                  b(heartbeat(101, true, false)), b_commit(batch(2, 1, 20, 10))})},
           {"resend", join_messages({a(batch(1, 0, 0, 5)), a(batch(1, 0, 0, 5))})},
           {"resend-after-commit", join_messages({a_commit(batch(1, 0, 0, 5)), a(batch(1, 0, 0, 5))})},
           {"restart", join_messages({a(batch(1, 0, 0, 5)), a(hello("node-a", kInstance + 1)),
                                      a(batch(1, 0, 5, 5, kInstance + 1))})},
           {"comm-end",
            join_messages({a(batch(1, 0, 0, 3)), b(batch(1, 1, 0, 3)), a(comm_end(2, 0)), b_commit(comm_end(2, 1))})},
           // The attacks of the security review (docs/operations.md, "Threat model").
           {"grow", join_messages({a_commit(batch(1, 0, 0, 1)), a(batch(2, 60'000, 0, 1, kInstance, 65'536))})},
           {"huge",
            join_messages({a(batch(1, 0, 0, 64, kInstance, 65'536)), a_commit(batch(2, 1, 0, 64, kInstance, 65'536))})},
           {"rebind", join_messages({a_commit(batch(1, 0, 0, 5)), b(batch(1, 0, 5, 5))})},
           {"stranger-end", join_messages({a(batch(1, 0, 0, 3)), b_commit(comm_end(1, 0))})},
           {"other-key", join_messages({a(batch(1, 0, 0, 3)), routed(kOtherKey, batch(2, 0, 3, 3))})},
           {"exited", a(heartbeat(100, false, false))},
           // Found by a campaign: a start time past 2^64 ns overflowed the ledger's cast.
           {"start-time-overflow",
            join_messages({a(batch(1, 0, 0, 3, kInstance, 2, UINT64_MAX / 2)), a_commit(heartbeat(100, true, true))})},
           {"probe", a(clock_probe(1))},
           {"hello-again", b(hello("node-b", 7))},
       }});
  corpora.push_back({"query",
                     {
                         {"status", status_request()},
                         {"jobs", jobs_request()},
                         {"timeline", timeline_request("c0ffee", -1, 20)},
                         {"timeline-rank-all", timeline_request("c0", 1, 0)},
                         {"findings-open-hangs", findings_request(true, "hang", 5)},
                         {"findings-all", findings_request(false, "", 200)},
                         {"future", future_request()},
                     }});
  std::vector<std::pair<std::string, std::string>> configs = {
      {"collector-all", "listen = tcp://0.0.0.0:7600\nquery = tcp://127.0.0.1:7601\ndb = /var/lib/rankscope/db\n"
                        "liveness-ms = 5000\nhang-timeout-s = 30\nnode-lost-timeout-s = 15\n"
                        "metrics = 0.0.0.0:9464\nalertmanager = http://127.0.0.1:9093\nlog-level = info\n"},
      {"agent-all", "# every option of the agent\ncollector = tcp://collector:7600\nnode = gpu-12\n"
                    "netns = /run/netns/rs-n1\ncgroup = /sys/fs/cgroup/unified/slurm\npid = 100\npid = 101\n"
                    "nccl-lib = /opt/lib/libnccl.so.2\ncuda-waits = false\nbatch-interval-ms = 100\n"
                    "scan-interval-ms = 500\nack-timeout-ms = 2000\nmax-unacked-mb = 64\n"
                    "test-clock-offset-ns = -250000000\nlog-level = debug\n"},
      {"help", "help = 1\n"},
      {"empty", ""},
  };
  for (const char* name : {"agent.conf.example", "collector.conf.example"}) {
    std::ifstream in(source / "deploy" / name, std::ios::binary);
    if (!in) {
      std::cerr << "fuzz-make-seeds: cannot read " << (source / "deploy" / name) << "\n";
      return 1;
    }
    configs.push_back({name, std::string(std::istreambuf_iterator<char>(in), {})});
  }
  corpora.push_back({"config", configs});

  for (const auto& [target, seeds] : corpora) {
    fs::path dir = out / target;
    std::error_code error;
    fs::create_directories(dir, error);
    for (const auto& [name, bytes] : seeds) {
      if (!write(dir, name, bytes)) {
        std::cerr << "fuzz-make-seeds: cannot write " << (dir / name) << "\n";
        return 1;
      }
    }
  }
  return 0;
}
