#include "tests/support/prometheus.h"

#include <fstream>

#include "collector/alert/http.h"

namespace rankscope::testing {

using collector::http_request;
using nlohmann::json;

namespace {
// "a b" -> "a%20b": a query as a form field.
std::string form_encoded(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}
}  // namespace

RealPrometheus::RealPrometheus(const std::vector<std::string>& targets, const std::vector<std::string>& rule_files,
                               const std::string& alertmanager)
    : port_(free_port()) {
  // JSON is YAML: the configuration written with the JSON library.
  json config = {{"global", {{"scrape_interval", "1s"}, {"evaluation_interval", "1s"}}},
                 {"rule_files", rule_files},
                 {"scrape_configs", json::array({{{"job_name", "rankscope"},
                                                  {"static_configs", json::array({{{"targets", targets}}})}}})}};
  if (!alertmanager.empty()) {
    std::string host = alertmanager.substr(alertmanager.find("://") + 3);
    config["alerting"] = {{"alertmanagers", json::array({{{"static_configs", json::array({{{"targets", {host}}}})}}})}};
  }
  std::ofstream(dir_.file("prometheus.yml")) << config.dump(2);
  SpawnOptions spawn;
  spawn.argv = {kPrometheus, "--config.file=" + dir_.file("prometheus.yml"),
                "--storage.tsdb.path=" + dir_.file("data"), "--web.listen-address=127.0.0.1:" + std::to_string(port_)};
  spawn.stdout_path = dir_.file("prometheus.log");
  process_ = std::make_unique<Process>(spawn);
}

bool RealPrometheus::ready() {
  return wait_for(
      [&] {
        auto response = http_request("GET", url() + "/-/ready", "", "", 500);
        return response && response->status == 200;
      },
      std::chrono::seconds(30));
}

json RealPrometheus::query(const std::string& expr) {
  auto response = http_request("POST", url() + "/api/v1/query", "query=" + form_encoded(expr),
                               "application/x-www-form-urlencoded", 3000);
  if (!response || response->status != 200) return nullptr;
  json reply = json::parse(response->body, nullptr, false);
  if (reply.is_discarded() || reply.value("status", "") != "success") return nullptr;
  return reply["data"];
}

std::string RealPrometheus::alert_state(const std::string& name) {
  auto response = http_request("GET", url() + "/api/v1/alerts", "", "", 3000);
  if (!response || response->status != 200) return "";
  json reply = json::parse(response->body, nullptr, false);
  if (reply.is_discarded()) return "";
  std::string state = "inactive";
  for (const auto& alert : reply["data"]["alerts"])
    if (alert["labels"].value("alertname", "") == name) {
      if (alert.value("state", "") == "firing") return "firing";
      state = alert.value("state", state);
    }
  return state;
}

}  // namespace rankscope::testing
