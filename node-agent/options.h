#pragma once
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "common/curve.h"
#include "common/result.h"

namespace rankscope::agent {

constexpr uint32_t kDefaultUserTableShare = 25;  // --user-table-share, percent

struct Options {
  std::string collector = "tcp://127.0.0.1:7600";  // ZeroMQ endpoint of the collector's agent socket
  std::string node;                                 // node name; default: the host name
  // Scope: which processes this agent traces. Empty: every process on the kernel.
  std::string netns;                                // a network namespace file (/run/netns/NAME, /proc/PID/ns/net)
  std::string cgroup;                               // a cgroup v2 directory: trace processes at or below it
  std::vector<uint32_t> pids;                       // only these processes
  std::vector<std::string> nccl_libs;               // libnccl copies to attach at start, besides the standard places
  bool cuda_waits = true;                           // also time libcudart's synchronize calls
  bool host_context = true;                         // sched_switch/wakeup and TCP retransmit probes
  bool setenv_probe = true;                         // libc setenv: CUDA_VISIBLE_DEVICES changed at run time
  bool multi_uprobes = true;                        // multi-uprobe links where the kernel has them (6.6+)
  // Each user's share of the BPF tables all traced processes share
  // (processes, communicators, point-to-point lanes, followed threads), in
  // percent: past it that user's new ones are not traced, so no user can
  // fill them and blind the agent to the others' jobs.
  uint32_t user_table_share = kDefaultUserTableShare;
  std::string proc_root = "/proc";
  // Where the container runtimes keep their state (containerd, CRI-O,
  // Docker): a pod's namespace and name are read from its containers'
  // annotations under this root ("/" on the host; a DaemonSet mounts it).
  std::string container_state_root = "/";
  // Where the Slurm Prolog records each job's account (deploy/slurm/): a
  // process's account is read there, never from its environment.
  std::string slurm_jobs_dir = "/run/rankscope/slurm";
  uint32_t batch_interval_ms = 100;                 // a record waits at most this long before it is sent
  uint32_t scan_interval_ms = 500;                  // how often /proc is scanned for new NCCL processes
  uint32_t heartbeat_interval_ms = 1000;
  uint32_t clock_probe_interval_ms = 1000;
  // NCCL's proxy steps (the network side of each collective, through the
  // profiler plugin) are asked for where the collector wants them (a
  // straggler, slow link or hang suspected), and as a background sample
  // during the first proxy_detail_ms of every proxy_detail_period_ms of the
  // wall clock, so that every node's agent samples at once
  // (docs/gpu-timing.md). 0: no background sample; the period: always.
  uint32_t proxy_detail_period_ms = 30'000;
  uint32_t proxy_detail_ms = 1'000;
  uint32_t ack_timeout_ms = 2000;                   // re-send a batch not acknowledged within this time
  uint64_t max_unacked_bytes = 64ull << 20;         // bound on memory held for unacknowledged batches
  std::string spool_dir = "/var/lib/rankscope/spool"; // unacked batches on disk, in <spool_dir>/<node>; "": memory only
  uint64_t spool_max_bytes = 1ull << 30;            // bound on the spool; past it the oldest records go (counted)
  int64_t test_clock_offset_ns = 0;                 // tests only: shift this node's clock (events and probes)
  std::string log_level = "info";
  // CurveZMQ (docs/operations.md "Keys"): this node's key pair and the collector's public key.
  std::string key = "/etc/rankscope/agent.key";
  std::string collector_key = "/etc/rankscope/collector.pub";
  bool insecure = false;  // plaintext, for a collector run with --insecure
  curve::ClientKeys keys;  // loaded from `key` and `collector_key` by main (load_keys); empty: plaintext
};

// Loads options.keys from the key files, unless --insecure.
Result<void> load_keys(Options& options);

// What a command line asked for.
struct CommandLine {
  Options options;   // node is "" unless given: the caller puts in the host name
  bool help = false;  // --help: print usage() and stop
  bool check = false; // `rankscope-agent check`: report what can be traced, trace nothing
};

// The text --help prints.
std::string usage();

// Parses the command (`check`), the flags and the config file that --config
// names (a flag wins over the same key in the file), then checks every value.
// Never throws: an error carries a message for the user, without the program's name.
Result<CommandLine> parse_command_line(int argc, const char* const* argv);
// The same with the config file's contents already at hand (`config` may be
// null: no file); the name --config gives is not opened.
Result<CommandLine> parse_command_line(int argc, const char* const* argv, std::istream* config);
// Checks the ranges and forms of the values (done by parse_command_line).
Result<void> validate(const Options& options);

}  // namespace rankscope::agent
