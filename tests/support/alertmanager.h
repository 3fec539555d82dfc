#pragma once
// A real Alertmanager (Debian's prometheus-alertmanager) for tests: a free
// loopback port, a route to a receiver that notifies nobody, no clustering;
// optionally behind TLS and basic auth (its --web.config.file).
#include <memory>
#include <string>
#include <vector>

#include "collector/alert/http.h"
#include "tests/support/harness.h"

namespace rankscope::testing {

constexpr const char* kAlertmanager = "/usr/bin/prometheus-alertmanager";

// A certificate authority and a certificate it signed for 127.0.0.1, made
// with the openssl command in a folder of their own.
class TestCertificates {
 public:
  TestCertificates();
  bool ok() const { return ok_; }
  std::string ca() const { return dir_.file("ca.crt"); }
  std::string cert() const { return dir_.file("server.crt"); }
  std::string key() const { return dir_.file("server.key"); }
  std::string log() const { return slurp(dir_.file("openssl.log")); }

 private:
  TempDir dir_;
  bool ok_ = false;
};

// Alertmanager's own web server: TLS with these files, and a basic-auth
// user (its bcrypt hash made with /usr/bin/python3's bcrypt).
struct AlertmanagerWeb {
  const TestCertificates* tls = nullptr;
  std::string user, password;
};

// Killed, and its folder removed, by the destructor whatever the test did.
class RealAlertmanager {
 public:
  explicit RealAlertmanager(const AlertmanagerWeb& web = {});
  std::string url() const {
    return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_);
  }
  // How a client that trusts its CA and knows its user reaches it.
  const collector::HttpClientOptions& client() const { return client_; }
  std::string log() const { return slurp(dir_.file("alertmanager.log")); }
  // Waits (20 s at most) until it answers /-/ready.
  bool ready();
  // Every alert Alertmanager holds, in any state: one JSON object each.
  std::vector<std::string> alerts();

 private:
  TempDir dir_;
  int port_;
  bool tls_ = false;
  collector::HttpClientOptions client_;
  std::unique_ptr<Process> process_;  // last: killed before the folder goes
};

// Alertmanager writes JSON compactly: "key":"value".
bool has_field(const std::string& object, const std::string& key, const std::string& value);
// Splits a JSON array into its top-level objects' text.
std::vector<std::string> array_objects(const std::string& json);

}  // namespace rankscope::testing
