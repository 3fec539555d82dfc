// Fuzz target: config files. Each input is the text of a config file
// (key = value, the flags' names), read by the collector's and by the
// agent's real option parsing and validation (the same functions their
// main() calls). Whatever the text, parsing returns options or an error:
// it never throws, crashes or reads out of bounds, and options it accepts
// are within the ranges the programs rely on.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "collector/options.h"
#include "node-agent/options.h"

using namespace rankscope;

namespace {
void require(bool ok, const char* what) {
  if (ok) return;
  fprintf(stderr, "accepted options break an invariant: %s\n", what);
  abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  {
    const char* argv[] = {"rankscope-collector", "--config", "fuzz.conf"};
    std::istringstream file(text);
    auto line = collector::parse_command_line(3, argv, &file);
    if (line && !line->help) {
      const collector::Options& o = line->options;
      require(collector::validate(o).ok(), "collector options pass validate()");
      // What run() derives from them.
      require(o.hang_timeout_ns() >= 1'000'000'000ull, "hang timeout of 1 s or more");
      require(o.node_lost_timeout_ns() >= 3'000'000'000ull, "node-lost timeout of 3 s or more");
      require(o.liveness_ns() > 0, "liveness window");
    }
  }
  {
    const char* argv[] = {"rankscope-agent", "check", "--config", "fuzz.conf"};
    std::istringstream file(text);
    auto line = agent::parse_command_line(4, argv, &file);
    if (line && !line->help) {
      const agent::Options& o = line->options;
      require(line->check, "`check` is seen as the command");
      require(agent::validate(o).ok(), "agent options pass validate()");
      require(o.max_unacked_bytes >= (1u << 20), "at least 1 MiB for unacked batches");
      require(o.batch_interval_ms > 0 && o.ack_timeout_ms > 0 && o.scan_interval_ms > 0, "intervals above zero");
    }
  }
  return 0;
}
