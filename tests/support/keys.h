#pragma once
// CurveZMQ keys for a test deployment, made in its temporary folder the way
// an operator makes them (common/curve.h, what `rankscope keygen` calls): a
// collector key pair, an allow-list directory, and keys for agents and
// clients, admitted or not.
#include <string>
#include <vector>

#include "common/curve.h"
#include "tests/support/harness.h"

namespace rankscope::testing {

class TestKeys {
 public:
  // Makes DIR/keys/collector.{key,pub}, DIR/keys/allowed/ and an admitted client key.
  explicit TestKeys(const TempDir& dir);
  // Flags for the collector: --key, --allow.
  std::vector<std::string> collector_args() const;
  // Makes (once) a key for `node`, admitted when `admitted`; returns the agent's --key and --collector-key flags.
  std::vector<std::string> agent_args(const std::string& node, bool admitted = true);
  // The admitted client's flags for the rankscope CLI: --key, --collector-key.
  std::vector<std::string> cli_args() const;
  curve::ClientKeys client() const;
  // A client key that is not in the allow-list.
  curve::ClientKeys unknown_client();
  // A key file made for `name` and `role`; in the allow-list when `admitted`. Returns the .key path.
  std::string make(const std::string& name, const std::string& role, bool admitted);
  const std::string& collector_public() const { return collector_pub_; }
  const std::string& allow_dir() const { return allow_dir_; }

 private:
  std::string dir_, allow_dir_, collector_key_, collector_pub_, client_key_;
};

}  // namespace rankscope::testing
