#include "tests/support/alertmanager.h"

#include <fstream>

#include "collector/alert/http.h"
#include "common/format.h"

namespace rankscope::testing {

using collector::http_request;

RealAlertmanager::RealAlertmanager() : port_(free_port()) {
  std::ofstream(dir_.file("alertmanager.yml")) << "route:\n"
                                                  "  receiver: nobody\n"
                                                  "  group_wait: 100ms\n"
                                                  "receivers:\n"
                                                  "  - name: nobody\n";
  SpawnOptions spawn;
  spawn.argv = {kAlertmanager, "--config.file=" + dir_.file("alertmanager.yml"),
                "--storage.path=" + dir_.file("data"), "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                "--cluster.listen-address="};
  spawn.stdout_path = dir_.file("alertmanager.log");
  process_ = std::make_unique<Process>(spawn);
}

bool RealAlertmanager::ready() {
  return wait_for(
      [&] {
        auto response = http_request("GET", url() + "/-/ready", "", "", 500);
        return response && response->status == 200;
      },
      std::chrono::seconds(20));
}

std::vector<std::string> RealAlertmanager::alerts() {
  auto response = http_request("GET", url() + "/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true");
  if (!response || response->status != 200) return {};
  return array_objects(response->body);
}

bool has_field(const std::string& object, const std::string& key, const std::string& value) {
  return object.find(json_quote(key) + ":" + json_quote(value)) != std::string::npos;
}

std::vector<std::string> array_objects(const std::string& json) {
  std::vector<std::string> objects;
  int depth = 0;
  bool in_string = false;
  size_t start = 0;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      if (depth++ == 0) start = i;
    } else if (c == '}') {
      if (--depth == 0) objects.push_back(json.substr(start, i - start + 1));
    }
  }
  return objects;
}

}  // namespace rankscope::testing
