#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rankscope::agent {

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
  std::string proc_root = "/proc";
  uint32_t batch_interval_ms = 100;                 // a record waits at most this long before it is sent
  uint32_t scan_interval_ms = 500;                  // how often /proc is scanned for new NCCL processes
  uint32_t heartbeat_interval_ms = 1000;
  uint32_t clock_probe_interval_ms = 1000;
  uint32_t ack_timeout_ms = 2000;                   // re-send a batch not acknowledged within this time
  uint64_t max_unacked_bytes = 64ull << 20;         // bound on memory held for unacknowledged batches
  int64_t test_clock_offset_ns = 0;                 // tests only: shift this node's clock (events and probes)
  std::string log_level = "info";
};

}  // namespace rankscope::agent
