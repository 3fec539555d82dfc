// rankscope-collector: receives what the node agents trace, keeps the
// per-rank NCCL timelines, and answers the rankscope CLI.
#include <atomic>
#include <boost/program_options.hpp>
#include <csignal>
#include <fstream>
#include <iostream>

#include "collector/collector.h"
#include "common/log.h"

namespace po = boost::program_options;

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  rankscope::log::set_program("rankscope-collector");
  rankscope::collector::Options options;
  po::options_description desc(
      "rankscope-collector: the central collector of rankscope. Node agents send it their NCCL traces; the "
      "rankscope CLI asks it questions.\n\nUsage: rankscope-collector [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config", po::value<std::string>(), "read options from this file (key = value, same names as the flags)")
    ("listen", po::value(&options.listen)->default_value(options.listen), "ZeroMQ endpoint the agents connect to")
    ("query", po::value(&options.query)->default_value(options.query), "ZeroMQ endpoint the CLI connects to")
    ("db", po::value(&options.db)->default_value(options.db), "RocksDB directory (created if missing)")
    ("liveness-ms", po::value(&options.liveness_ms)->default_value(options.liveness_ms), "a node silent for longer is shown as disconnected")
    ("hang-timeout-s", po::value(&options.hang_timeout_s)->default_value(options.hang_timeout_s), "ranks missing from a collective for this long are a hang (1 s at least)")
    ("node-lost-timeout-s", po::value(&options.node_lost_timeout_s)->default_value(options.node_lost_timeout_s), "an agent silent for this long, with ranks running, is a lost node")
    ("metrics", po::value(&options.metrics), "serve Prometheus metrics on HOST:PORT (e.g. 0.0.0.0:9464)")
    ("alertmanager", po::value(&options.alertmanager), "push findings to this Alertmanager (http://HOST:PORT, API v2)")
    ("log-level", po::value(&options.log_level)->default_value(options.log_level), "error, warn, info or debug");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("config")) {
      std::ifstream file(vm["config"].as<std::string>());
      if (!file) {
        std::cerr << "rankscope-collector: cannot read config file " << vm["config"].as<std::string>() << "\n";
        return 2;
      }
      po::store(po::parse_config_file(file, desc), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope-collector: " << e.what() << "\n(see rankscope-collector --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (!rankscope::log::set_level(options.log_level)) {
    std::cerr << "rankscope-collector: --log-level must be error, warn, info or debug\n";
    return 2;
  }
  if (options.hang_timeout_s < 1) {
    std::cerr << "rankscope-collector: --hang-timeout-s must be at least 1 (collectives legitimately take milliseconds to seconds)\n";
    return 2;
  }
  if (options.node_lost_timeout_s < 3) {
    std::cerr << "rankscope-collector: --node-lost-timeout-s must be at least 3 (agents send a heartbeat every second)\n";
    return 2;
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return rankscope::collector::run(options, g_stop);
}
