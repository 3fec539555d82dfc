#pragma once
#include <cstdint>
#include <string>

namespace rankscope::collector {

struct Options {
  std::string listen = "tcp://0.0.0.0:7600";      // agents connect here (ZeroMQ ROUTER)
  std::string query = "tcp://127.0.0.1:7601";     // the CLI connects here
  std::string db = "/var/lib/rankscope/db";       // RocksDB directory
  uint32_t liveness_ms = 5000;                    // a node silent for longer is shown as disconnected
  std::string log_level = "info";
};

}  // namespace rankscope::collector
