// rankscope-agent: the node agent. Options come from flags and, with the
// same names, from a config file (--config).
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <iostream>

#include "common/log.h"
#include "node-agent/agent.h"
#include "node-agent/check.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}
}  // namespace

int main(int argc, char** argv) {
  rankscope::log::set_program("rankscope-agent");
  auto line = rankscope::agent::parse_command_line(argc, argv);
  if (!line) {
    std::cerr << "rankscope-agent: " << line.error().message << "\n(see rankscope-agent --help)\n";
    return 2;
  }
  if (line->help) {
    std::cout << rankscope::agent::usage() << "\n";
    return 0;
  }
  rankscope::agent::Options& options = line->options;
  rankscope::log::set_level(options.log_level);
  if (options.node.empty()) options.node = host_name();

  if (line->check) return rankscope::agent::run_check(options, std::cout);
  if (auto keys = rankscope::agent::load_keys(options); !keys) {
    std::cerr << "rankscope-agent: " << keys.error().message << "\n";
    return 2;
  }
  if (options.insecure)
    RS_LOG(warn, "--insecure: talking to %s in plaintext, without a key", options.collector.c_str());
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return rankscope::agent::run(options, g_stop);
}
