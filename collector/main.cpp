// rankscope-collector: receives what the node agents trace, keeps the
// per-rank NCCL timelines, and answers the rankscope CLI.
#include <atomic>
#include <csignal>
#include <iostream>

#include "collector/collector.h"
#include "common/log.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  rankscope::log::set_program("rankscope-collector");
  auto line = rankscope::collector::parse_command_line(argc, argv);
  if (!line) {
    std::cerr << "rankscope-collector: " << line.error().message << "\n(see rankscope-collector --help)\n";
    return 2;
  }
  if (line->help) {
    std::cout << rankscope::collector::usage() << "\n";
    return 0;
  }
  rankscope::log::set_level(line->options.log_level);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return rankscope::collector::run(line->options, g_stop);
}
