#pragma once
// A real Alertmanager (Debian's prometheus-alertmanager) for tests: a free
// loopback port, a route to a receiver that notifies nobody, no clustering.
#include <memory>
#include <string>
#include <vector>

#include "tests/support/harness.h"

namespace rankscope::testing {

constexpr const char* kAlertmanager = "/usr/bin/prometheus-alertmanager";

// Killed, and its folder removed, by the destructor whatever the test did.
class RealAlertmanager {
 public:
  RealAlertmanager();
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return slurp(dir_.file("alertmanager.log")); }
  // Waits (20 s at most) until it answers /-/ready.
  bool ready();
  // Every alert Alertmanager holds, in any state: one JSON object each.
  std::vector<std::string> alerts();

 private:
  TempDir dir_;
  int port_;
  std::unique_ptr<Process> process_;  // last: killed before the folder goes
};

// Alertmanager writes JSON compactly: "key":"value".
bool has_field(const std::string& object, const std::string& key, const std::string& value);
// Splits a JSON array into its top-level objects' text.
std::vector<std::string> array_objects(const std::string& json);

}  // namespace rankscope::testing
