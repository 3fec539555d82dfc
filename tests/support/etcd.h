#pragma once
// A real etcd cluster for tests (Debian's etcd-server): N members on free
// loopback ports, each with its data in the cluster's own folder. A member
// can be killed and started again on the same data, as after a crash.
#include <memory>
#include <string>
#include <vector>

#include "tests/support/harness.h"

namespace rankscope::testing {

constexpr const char* kEtcd = "/usr/bin/etcd";

// Killed, and its folder removed, by the destructor whatever the test did.
class RealEtcd {
 public:
  explicit RealEtcd(int members);
  // The client URLs of every member, comma-separated (what --etcd takes).
  std::string endpoints() const;
  std::string endpoint(int member) const { return "http://127.0.0.1:" + std::to_string(client_ports_.at(member)); }
  // Waits (30 s at most) until every running member answers a read.
  bool ready();
  void kill(int member);   // SIGKILL
  void start(int member);  // again, on its data
  std::string log(int member) const { return slurp(dir_.file("etcd-" + std::to_string(member) + ".log")); }
  // Puts `value` at `key` under a new lease of `ttl_s` (0: no lease); false on failure.
  bool put(const std::string& key, const std::string& value, int ttl_s);

 private:
  TempDir dir_;
  std::string token_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<std::unique_ptr<Process>> members_;  // last: killed before the folder goes
};

}  // namespace rankscope::testing
