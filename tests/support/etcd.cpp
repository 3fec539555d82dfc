#include "tests/support/etcd.h"

#include <csignal>

#include "collector/fleet/etcd.h"

namespace rankscope::testing {

RealEtcd::RealEtcd(int members) : token_(unique_name("rs-etcd")) {
  for (int i = 0; i < members; ++i) {
    client_ports_.push_back(free_port());
    peer_ports_.push_back(free_port());
  }
  members_.resize(members);
  for (int i = 0; i < members; ++i) start(i);
}

std::string RealEtcd::endpoints() const {
  std::string out;
  for (size_t i = 0; i < client_ports_.size(); ++i) out += (i ? "," : "") + endpoint(static_cast<int>(i));
  return out;
}

void RealEtcd::start(int member) {
  std::string cluster;
  for (size_t i = 0; i < peer_ports_.size(); ++i)
    cluster += (i ? "," : "") + ("m" + std::to_string(i)) + "=http://127.0.0.1:" + std::to_string(peer_ports_[i]);
  const std::string name = "m" + std::to_string(member);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_ports_.at(member));
  SpawnOptions spawn;
  spawn.argv = {kEtcd, "--name", name, "--data-dir", dir_.file(name), "--listen-client-urls", endpoint(member),
                "--advertise-client-urls", endpoint(member), "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster, "--initial-cluster-token", token_,
                "--initial-cluster-state", "new",
                // Elections within a second or two on a busy 2-core machine.
                "--heartbeat-interval", "100", "--election-timeout", "1000"};
  spawn.stdout_path = dir_.file("etcd-" + std::to_string(member) + ".log");
  members_.at(member) = std::make_unique<Process>(spawn);
}

void RealEtcd::kill(int member) {
  if (members_.at(member)) {
    members_[member]->signal(SIGKILL);
    members_[member]->wait(std::chrono::seconds(10));
    members_[member].reset();
  }
}

bool RealEtcd::ready() {
  return wait_for(
      [&] {
        for (size_t i = 0; i < members_.size(); ++i) {
          if (!members_[i]) continue;
          collector::HttpClientOptions http;
          http.timeout_ms = 1000;
          auto client = fleet::EtcdClient::make(endpoint(static_cast<int>(i)), http);
          if (!client || !client->range_prefix("/ready-check/")) return false;
        }
        return true;
      },
      std::chrono::seconds(30));
}

bool RealEtcd::put(const std::string& key, const std::string& value, int ttl_s) {
  auto client = fleet::EtcdClient::make(endpoints());
  if (!client) return false;
  int64_t lease = 0;
  if (ttl_s > 0) {
    auto granted = client->grant_lease(ttl_s);
    if (!granted) return false;
    lease = *granted;
  }
  return client->put(key, value, lease).ok();
}

}  // namespace rankscope::testing
