// rankscope-agent: the node agent. Options come from flags and, with the
// same names, from a config file (--config).
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <csignal>
#include <fstream>
#include <iostream>

#include "common/log.h"
#include "node-agent/agent.h"
#include "node-agent/check.h"

namespace po = boost::program_options;

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
  rankscope::agent::Options options;
  std::string config;
  po::options_description desc(
      "rankscope-agent: traces NCCL calls of the GPU jobs on this node with eBPF and sends them to the "
      "rankscope collector.\n\nUsage: rankscope-agent [options]\n       rankscope-agent check [options]   "
      "(can this node be traced? what would be?)\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config", po::value(&config), "read options from this file (key = value, same names as the flags)")
    ("collector", po::value(&options.collector)->default_value(options.collector), "collector's agent endpoint (ZeroMQ)")
    ("node", po::value(&options.node), "name of this node (default: the host name)")
    ("netns", po::value(&options.netns), "trace only processes in this network namespace (/run/netns/NAME or /proc/PID/ns/net)")
    ("cgroup", po::value(&options.cgroup), "trace only processes in this cgroup v2 directory or below it")
    ("pid", po::value(&options.pids)->multitoken(), "trace only these processes")
    ("nccl-lib", po::value(&options.nccl_libs)->multitoken(), "also probe this libnccl.so (probed before any process starts)")
    ("cuda-waits", po::value(&options.cuda_waits)->default_value(options.cuda_waits), "time the host's waits on the GPU (libcudart's stream, device and event synchronize)")
    ("host-context", po::value(&options.host_context)->default_value(options.host_context), "follow the scheduler for traced threads and CPU per cgroup (sched_switch, sched_wakeup) and TCP retransmits")
    ("setenv-probe", po::value(&options.setenv_probe)->default_value(options.setenv_probe), "see CUDA_VISIBLE_DEVICES set at run time (uprobe on libc setenv)")
    ("batch-interval-ms", po::value(&options.batch_interval_ms)->default_value(options.batch_interval_ms), "longest time a record waits before it is sent")
    ("scan-interval-ms", po::value(&options.scan_interval_ms)->default_value(options.scan_interval_ms), "how often /proc is scanned for new NCCL processes and libraries")
    ("ack-timeout-ms", po::value(&options.ack_timeout_ms)->default_value(options.ack_timeout_ms), "re-send a batch the collector did not acknowledge within this time")
    ("max-unacked-mb", po::value<uint64_t>()->default_value(64), "memory for batches not yet acknowledged; the oldest are dropped (and counted) past it")
    ("test-clock-offset-ns", po::value(&options.test_clock_offset_ns)->default_value(0), "tests only: pretend this node's clock is off by this much")
    ("log-level", po::value(&options.log_level)->default_value(options.log_level), "error, warn, info or debug");
  // clang-format on
  // `check` is a command, not an option.
  bool check = argc > 1 && std::string(argv[1]) == "check";
  if (check) {
    --argc;
    ++argv;
  }
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("config")) {
      std::ifstream file(vm["config"].as<std::string>());
      if (!file) {
        std::cerr << "rankscope-agent: cannot read config file " << vm["config"].as<std::string>() << "\n";
        return 2;
      }
      po::store(po::parse_config_file(file, desc), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope-agent: " << e.what() << "\n(see rankscope-agent --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (!rankscope::log::set_level(options.log_level)) {
    std::cerr << "rankscope-agent: --log-level must be error, warn, info or debug\n";
    return 2;
  }
  options.max_unacked_bytes = vm["max-unacked-mb"].as<uint64_t>() << 20;
  if (options.node.empty()) options.node = host_name();

  if (check) return rankscope::agent::run_check(options, std::cout);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return rankscope::agent::run(options, g_stop);
}
