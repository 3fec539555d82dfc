#include "node-agent/options.h"

#include <boost/program_options.hpp>

#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string_view>

#include "common/log.h"
#include "common/options_text.h"

namespace rankscope::agent {

namespace po = boost::program_options;

namespace {
constexpr uint64_t kMaxUnackedMb = 1u << 20;  // 1 TiB: more is a typo (and would overflow bytes)
constexpr size_t kMaxNodeName = 255;          // what the collector accepts

po::options_description describe(Options& options, uint64_t& max_unacked_mb, uint64_t& spool_max_mb) {
  po::options_description desc(
      "rankscope-agent: traces NCCL calls of the GPU jobs on this node with eBPF and sends them to the "
      "rankscope collector.\n\nUsage: rankscope-agent [options]\n       rankscope-agent check [options]   "
      "(can this node be traced? what would be?)\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config", po::value<std::string>(), "read options from this file (key = value, same names as the flags)")
    ("collector", po::value(&options.collector)->default_value(options.collector), "collector's agent endpoint (ZeroMQ)")
    ("node", po::value(&options.node), "name of this node, 1 to 255 bytes (default: the host name)")
    ("netns", po::value(&options.netns), "trace only processes in this network namespace (/run/netns/NAME or /proc/PID/ns/net)")
    ("cgroup", po::value(&options.cgroup), "trace only processes in this cgroup v2 directory or below it")
    ("pid", po::value(&options.pids)->multitoken(), "trace only these processes")
    ("nccl-lib", po::value(&options.nccl_libs)->multitoken(), "also probe this libnccl.so (probed before any process starts)")
    ("cuda-waits", po::value(&options.cuda_waits)->default_value(options.cuda_waits), "time the host's waits on the GPU (libcudart's stream, device and event synchronize)")
    ("host-context", po::value(&options.host_context)->default_value(options.host_context), "follow the scheduler for traced threads and CPU per cgroup (sched_switch, sched_wakeup) and TCP retransmits")
    ("container-state-root", po::value(&options.container_state_root)->default_value(options.container_state_root), "where /run/containerd, /run/containers and /var/lib/docker are: a Kubernetes pod's namespace and name are read from its container's annotations there")
    ("slurm-jobs-dir", po::value(&options.slurm_jobs_dir)->default_value(options.slurm_jobs_dir), "where deploy/slurm/rankscope-prolog.sh records each Slurm job's account (root-owned; \"\": accounts not read)")
    ("setenv-probe", po::value(&options.setenv_probe)->default_value(options.setenv_probe), "see CUDA_VISIBLE_DEVICES set at run time (uprobe on libc setenv)")
    ("user-table-share", po::value(&options.user_table_share)->default_value(options.user_table_share), "percent of each BPF table that every traced process shares (processes, communicators, point-to-point lanes, threads) that one user's processes may hold; past it that user's new ones are not traced (counted as the drop reason user_share), so that no user can fill the tables and hide the other users' jobs (1 to 100; 100 on a node that one user has to itself)")
    ("multi-uprobes", po::value(&options.multi_uprobes)->default_value(options.multi_uprobes), "attach the uprobes as one multi-uprobe link per program and library where the kernel has them (Linux 6.6+; stopping takes well under a second); 0: one perf event per uprobe (about 0.1 s each to remove when the agent stops)")
    ("batch-interval-ms", po::value(&options.batch_interval_ms)->default_value(options.batch_interval_ms), "longest time a record waits before it is sent (1 ms to 60 s)")
    ("scan-interval-ms", po::value(&options.scan_interval_ms)->default_value(options.scan_interval_ms), "how often /proc is scanned for new NCCL processes and libraries (10 ms to 1 h)")
    ("ack-timeout-ms", po::value(&options.ack_timeout_ms)->default_value(options.ack_timeout_ms), "re-send a batch the collector did not acknowledge within this time, or within the acks' usual round trip if longer (a collector working through a backlog); the wait doubles with each re-send of the same batch, up to 60 s (100 ms to 1 h)")
    ("max-unacked-mb", po::value(&max_unacked_mb)->default_value(options.max_unacked_bytes >> 20), "memory for batches not yet acknowledged; past it the oldest are read back from the spool when sent (without a spool: dropped and counted) (1 to 1048576)")
    ("spool-dir", po::value(&options.spool_dir)->default_value(options.spool_dir), "keep batches on disk until the collector acknowledges them, in DIR/<node>; replayed after a reconnect or a restart of the agent (\"\": memory only)")
    ("spool-max-mb", po::value(&spool_max_mb)->default_value(options.spool_max_bytes >> 20), "disk for the spool; past it the oldest batches lose their records (summaries kept), counted and reported (1 to 1048576)")
    ("proxy-detail-ms", po::value(&options.proxy_detail_ms)->default_value(options.proxy_detail_ms), "besides when the collector asks for them (a straggler, slow link or hang suspected), ask the NCCL profiler plugin for NCCL's proxy steps (the network side of each collective: which link is slow) during this long of every --proxy-detail-period-ms, on the wall clock so that all nodes sample at once (0: only when asked; the period: always)")
    ("proxy-detail-period-ms", po::value(&options.proxy_detail_period_ms)->default_value(options.proxy_detail_period_ms), "see --proxy-detail-ms (100 ms to 1 h)")
    ("test-clock-offset-ns", po::value(&options.test_clock_offset_ns)->default_value(0), "tests only: pretend this node's clock is off by this much")
    ("log-level", po::value(&options.log_level)->default_value(options.log_level), "error, warn, info or debug")
    ("key", po::value(&options.key)->default_value(options.key), "this node's CurveZMQ key pair (rankscope keygen --role agent --name NODE); its name must be --node")
    ("collector-key", po::value(&options.collector_key)->default_value(options.collector_key), "the collector's public key file")
    ("insecure", po::bool_switch(&options.insecure), "plaintext, no key: only for a collector run with --insecure");
  // clang-format on
  return desc;
}

Result<void> check_range(const char* name, uint64_t value, uint64_t low, uint64_t high) {
  if (value >= low && value <= high) return {};
  return make_error(Errc::invalid_argument, std::string(name) + " must be between " + std::to_string(low) + " and " +
                                                std::to_string(high) + ", not " + std::to_string(value));
}

// `open_config` gives the stream to read for the file --config names (null: none).
template <typename OpenConfig>
Result<CommandLine> parse(int argc, const char* const* argv, OpenConfig open_config) {
  CommandLine line;
  // `check` is a command, not an option.
  if (argc > 1 && std::string_view(argv[1]) == "check") {
    line.check = true;
    --argc;
    ++argv;
  }
  uint64_t max_unacked_mb = 0, spool_max_mb = 0;
  po::options_description desc = describe(line.options, max_unacked_mb, spool_max_mb);
  for (int i = 1; i < argc; ++i)
    if (auto r = check_no_placeholders(argv[i], "argument " + std::to_string(i)); !r) return r.error();
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    std::string config = vm.count("config") ? vm["config"].as<std::string>() : "";
    auto file = open_config(config);
    if (!file) return file.error();
    if (*file) {
      std::string text(std::istreambuf_iterator<char>(**file), {});
      if (auto r = check_no_placeholders(text, "config file " + config); !r) return r.error();
      std::istringstream stream(text);
      po::store(po::parse_config_file(stream, desc), vm);
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    return make_error(Errc::invalid_argument, e.what());
  }
  line.help = vm.count("help") > 0;
  if (line.help) return line;
  if (auto r = check_range("--max-unacked-mb", max_unacked_mb, 1, kMaxUnackedMb); !r) return r.error();
  line.options.max_unacked_bytes = max_unacked_mb << 20;
  if (auto r = check_range("--spool-max-mb", spool_max_mb, 1, kMaxUnackedMb); !r) return r.error();
  line.options.spool_max_bytes = spool_max_mb << 20;
  if (auto valid = validate(line.options); !valid) return valid.error();
  return line;
}
}  // namespace

std::string usage() {
  Options options;
  uint64_t max_unacked_mb = 0, spool_max_mb = 0;
  std::ostringstream out;
  out << describe(options, max_unacked_mb, spool_max_mb);
  return out.str();
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv) {
  std::unique_ptr<std::ifstream> file;
  return parse(argc, argv, [&](const std::string& name) -> Result<std::istream*> {
    if (name.empty()) return static_cast<std::istream*>(nullptr);
    file = std::make_unique<std::ifstream>(name);
    if (!*file) return make_error(Errc::io, "cannot read config file " + name);
    return static_cast<std::istream*>(file.get());
  });
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv, std::istream* config) {
  return parse(argc, argv, [&](const std::string&) -> Result<std::istream*> { return config; });
}

Result<void> load_keys(Options& options) {
  if (options.insecure) return {};
  auto keys = curve::load_client_keys(options.key, options.collector_key);
  if (!keys)
    return make_error(keys.error().code, keys.error().message + " (--key, --collector-key; see docs/operations.md, or "
                                                                "--insecure for a collector run with --insecure)");
  options.keys = *keys;
  return {};
}

Result<void> validate(const Options& o) {
  if (!log::parse_level(o.log_level)) return make_error(Errc::invalid_argument, "--log-level must be error, warn, info or debug");
  if (o.collector.empty()) return make_error(Errc::invalid_argument, "--collector must not be empty");
  if (o.node.size() > kMaxNodeName) return make_error(Errc::invalid_argument, "--node must be 1 to 255 bytes");
  // The collector's rule (collector/ingest/validate.h): it refuses other names.
  for (char c : o.node)
    if (c <= ' ' || c > '~') return make_error(Errc::invalid_argument, "--node must be printable ASCII without spaces");
  if (!o.spool_dir.empty() && o.spool_dir[0] != '/')
    return make_error(Errc::invalid_argument, "--spool-dir must be an absolute path (or \"\" for no spool)");
  for (uint32_t pid : o.pids)
    if (pid == 0) return make_error(Errc::invalid_argument, "--pid takes process ids (1 and up), not 0");
  for (auto r : {check_range("--batch-interval-ms", o.batch_interval_ms, 1, 60'000),
                 check_range("--scan-interval-ms", o.scan_interval_ms, 10, 3'600'000),
                 check_range("--ack-timeout-ms", o.ack_timeout_ms, 100, 3'600'000),
                 check_range("--proxy-detail-period-ms", o.proxy_detail_period_ms, 100, 3'600'000),
                 check_range("--proxy-detail-ms", o.proxy_detail_ms, 0, o.proxy_detail_period_ms),
                 check_range("--max-unacked-mb", o.max_unacked_bytes >> 20, 1, kMaxUnackedMb),
                 check_range("--spool-max-mb", o.spool_max_bytes >> 20, 1, kMaxUnackedMb),
                 check_range("--user-table-share", o.user_table_share, 1, 100)})
    if (!r) return r;
  return {};
}

}  // namespace rankscope::agent
