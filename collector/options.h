#pragma once
#include <cstdint>
#include <string>

namespace rankscope::collector {

struct Options {
  std::string listen = "tcp://0.0.0.0:7600";      // agents connect here (ZeroMQ ROUTER)
  std::string query = "tcp://127.0.0.1:7601";     // the CLI connects here
  std::string db = "/var/lib/rankscope/db";       // RocksDB directory
  uint32_t liveness_ms = 5000;                    // a node silent for longer is shown as disconnected
  double hang_timeout_s = 30;                     // ranks missing from a collective this long: a hang
  double node_lost_timeout_s = 15;                // an agent silent this long: node_lost
  std::string metrics;                            // HOST:PORT for Prometheus; empty: off
  std::string alertmanager;                       // http://HOST:PORT of an Alertmanager; empty: off
  std::string log_level = "info";
};

}  // namespace rankscope::collector
