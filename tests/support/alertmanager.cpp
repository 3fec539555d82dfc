#include "tests/support/alertmanager.h"

#include <fstream>

#include "collector/alert/http.h"
#include "common/format.h"

namespace rankscope::testing {

using collector::http_request;

TestCertificates::TestCertificates() {
  std::ofstream(dir_.file("san.ext")) << "subjectAltName=IP:127.0.0.1\n";
  const std::string d = dir_.path();
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  ok_ = run_command("cd '" + d + "' && (openssl req -x509" + ec +
                    " -keyout ca.key -out ca.crt -days 2 -subj /CN=rankscope-test-ca"
                    " && openssl req" + ec + " -keyout server.key -out server.csr -subj /CN=127.0.0.1"
                    " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2"
                    " -extfile san.ext -out server.crt) > openssl.log 2>&1") == 0;
}

RealAlertmanager::RealAlertmanager(const AlertmanagerWeb& web) : port_(free_port()), tls_(web.tls != nullptr) {
  std::ofstream(dir_.file("alertmanager.yml")) << "route:\n"
                                                  "  receiver: nobody\n"
                                                  "  group_wait: 100ms\n"
                                                  "receivers:\n"
                                                  "  - name: nobody\n";
  SpawnOptions spawn;
  spawn.argv = {kAlertmanager, "--config.file=" + dir_.file("alertmanager.yml"),
                "--storage.path=" + dir_.file("data"), "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                "--cluster.listen-address="};
  if (web.tls || !web.user.empty()) {
    std::string config;
    if (web.tls) {
      config += "tls_server_config:\n  cert_file: " + web.tls->cert() + "\n  key_file: " + web.tls->key() + "\n";
      client_.ca_file = web.tls->ca();
    }
    if (!web.user.empty()) {
      std::ofstream(dir_.file("password")) << web.password;
      run_command("/usr/bin/python3 -c 'import bcrypt,sys; sys.stdout.write(bcrypt.hashpw(open(sys.argv[1], \"rb\")"
                  ".read(), bcrypt.gensalt(rounds=4)).decode())' " + dir_.file("password") + " > " +
                  dir_.file("password.hash") + " 2> " + dir_.file("bcrypt.log"));
      config += "basic_auth_users:\n  " + web.user + ": '" + slurp(dir_.file("password.hash")) + "'\n";
      client_.username = web.user;
      client_.password = web.password;
    }
    std::ofstream(dir_.file("web.yml")) << config;
    spawn.argv.push_back("--web.config.file=" + dir_.file("web.yml"));
  }
  spawn.stdout_path = dir_.file("alertmanager.log");
  process_ = std::make_unique<Process>(spawn);
}

bool RealAlertmanager::ready() {
  return wait_for(
      [&] {
        auto options = client_;
        options.timeout_ms = 500;
        auto response = http_request("GET", url() + "/-/ready", "", "", options);
        return response && response->status == 200;
      },
      std::chrono::seconds(20));
}

std::vector<std::string> RealAlertmanager::alerts() {
  auto response =
      http_request("GET", url() + "/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true", "", "",
                   client_);
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
