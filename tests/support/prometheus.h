#pragma once
// A real Prometheus (Debian's prometheus) for tests: a free loopback port, a
// one-second scrape of the collectors as job "rankscope" (the name
// deploy/prometheus/rankscope-rules.yml expects), rules evaluated every
// second, alerts sent to an Alertmanager.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/harness.h"

namespace rankscope::testing {

constexpr const char* kPrometheus = "/usr/bin/prometheus";

// Killed, and its folder removed, by the destructor whatever the test did.
class RealPrometheus {
 public:
  // targets: HOST:PORT of collectors' --metrics; rule_files: paths;
  // alertmanager: its URL (http://HOST:PORT), "" for none.
  RealPrometheus(const std::vector<std::string>& targets, const std::vector<std::string>& rule_files,
                 const std::string& alertmanager);
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return slurp(dir_.file("prometheus.log")); }
  // Waits (30 s at most) until it answers /-/ready.
  bool ready();
  // An instant query's `data` ({"resultType", "result"}); null when it failed.
  nlohmann::json query(const std::string& expr);
  // The state of alert `name` (inactive, pending, firing) as its rules hold it.
  std::string alert_state(const std::string& name);

 private:
  TempDir dir_;
  int port_;
  std::unique_ptr<Process> process_;  // last: killed before the folder goes
};

}  // namespace rankscope::testing
