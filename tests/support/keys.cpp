#include "tests/support/keys.h"

#include <sys/stat.h>

#include <filesystem>
#include <stdexcept>

namespace rankscope::testing {

namespace {
curve::KeyFile must(Result<curve::KeyFile> key) {
  if (!key) throw std::runtime_error("test keys: " + key.error().message);
  return *key;
}
}  // namespace

TestKeys::TestKeys(const TempDir& dir) : dir_(dir.file("keys")), allow_dir_(dir.file("keys/allowed")) {
  std::filesystem::create_directories(allow_dir_);
  collector_key_ = make("collector", "collector", false);
  collector_pub_ = dir_ + "/collector.pub";
  client_key_ = make("tester", "client", true);
}

std::string TestKeys::make(const std::string& name, const std::string& role, bool admitted) {
  std::string prefix = dir_ + "/" + role + "-" + name;
  if (!std::filesystem::exists(prefix + ".key")) {
    auto key = must(curve::generate(name, role));
    if (auto r = curve::write(prefix, key, false); !r) throw std::runtime_error("test keys: " + r.error().message);
    if (admitted) std::filesystem::copy_file(prefix + ".pub", allow_dir_ + "/" + role + "-" + name + ".pub");
  }
  if (role == "collector") {
    // collector.key / collector.pub, the names the docs use.
    std::filesystem::copy_file(prefix + ".key", dir_ + "/collector.key", std::filesystem::copy_options::skip_existing);
    std::filesystem::copy_file(prefix + ".pub", dir_ + "/collector.pub", std::filesystem::copy_options::skip_existing);
  }
  return prefix + ".key";
}

std::vector<std::string> TestKeys::collector_args() const { return {"--key", collector_key_, "--allow", allow_dir_}; }

std::vector<std::string> TestKeys::agent_args(const std::string& node, bool admitted) {
  return {"--key", make(node, "agent", admitted), "--collector-key", collector_pub_};
}

std::vector<std::string> TestKeys::cli_args() const { return {"--key", client_key_, "--collector-key", collector_pub_}; }

curve::ClientKeys TestKeys::client() const {
  auto keys = curve::load_client_keys(client_key_, collector_pub_);
  if (!keys) throw std::runtime_error("test keys: " + keys.error().message);
  return *keys;
}

curve::ClientKeys TestKeys::unknown_client() {
  auto keys = curve::load_client_keys(make("stranger", "client", false), collector_pub_);
  if (!keys) throw std::runtime_error("test keys: " + keys.error().message);
  return *keys;
}

}  // namespace rankscope::testing
