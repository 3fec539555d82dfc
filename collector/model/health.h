#pragma once
// What the agents say about the traced processes' scheduling, kept briefly
// per (node, pid) to explain findings: stopped, exited, starved of CPU.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace rankscope::collector {

struct HealthSample {
  uint64_t sample_ns = 0;  // node clock; only differences are used
  bool alive = true;
  char state = '?';
  uint64_t cpu_ns = 0;
  uint64_t runqueue_ns = 0;
  uint64_t stat_cpu_ns = 0;  // /proc/PID/stat utime + stime, all threads (kernel accounting); 0 unknown
  int32_t exit_status = -1;  // once it exited normally
  int32_t exit_signal = 0;   // once a signal killed it
  // BPF host counters of its calling threads (cumulative); host_known false
  // when its agent runs without them.
  bool host_known = false;
  uint64_t process_cpu_ns = 0;  // all threads
  uint64_t on_cpu_ns = 0, off_cpu_ns = 0, host_runqueue_ns = 0, iowait_ns = 0;
  uint64_t involuntary_switches = 0, major_faults = 0;
  uint32_t threads = 1;
  // Its cgroup's CPU quota and throttling (cumulative; 0 unknown).
  uint64_t cpu_periods = 0, cpu_throttled_periods = 0, cpu_throttled_ns = 0;
  uint32_t cpu_quota_millicpus = 0;
};

struct CpuShares {
  double running = 0;  // share of wall time on a CPU
  double waiting = 0;  // share of wall time runnable but waiting for a CPU
  bool known = false;
  // From the BPF host counters (per calling thread):
  bool host = false;
  double off_cpu = 0;  // share of wall time switched out (sleeping, blocked, or waiting for a CPU)
  double iowait = 0;   // share of wall time asleep on block I/O
  uint64_t involuntary_switches = 0, major_faults = 0;  // in the window
  double process_cpus = 0;                              // CPUs the whole process used on average
  // Its cgroup's CPU quota over the window: the share of enforcement periods
  // in which the cgroup ran out of quota, and of wall time it was throttled.
  uint32_t quota_millicpus = 0;
  double throttled_periods = 0;
  double throttled = 0;
};

// A host thread of the process blocked on the GPU (cudaStreamSynchronize...).
struct OpenWait {
  std::string call;       // "cudaStreamSynchronize"
  uint64_t since_ns = 0;  // cluster clock
};

// A collective NCCL enqueued in the process whose kernels have not all
// stopped (its profiler plugin): the oldest per communicator and op.
struct GpuOpen {
  uint64_t comm = 0;
  int32_t rank = -1;
  uint8_t op = 0;
  uint64_t seq = 0;              // NCCL's seqNumber
  uint64_t enqueued_ns = 0;      // cluster clock
  uint64_t kernel_start_ns = 0;  // cluster clock; 0: no kernel of it started
  // Where NCCL's proxy steps were on when it was enqueued: its send step
  // handed to the network longest ago and not done (wire GpuOpen).
  bool proxy_steps = false;      // proxy steps of it were seen
  int32_t send_peer = -1;        // -1: none
  uint64_t send_since_ns = 0;    // cluster clock
  bool detail = false;           // they were on (NCCL reports its proxy work)
};

class ProcessHealth {
 public:
  void add(const HealthSample& sample);
  // The waits on the GPU its agent saw in progress at the last heartbeat.
  void set_open_waits(std::vector<OpenWait> waits) { open_waits_ = std::move(waits); }
  const std::vector<OpenWait>& open_waits() const { return open_waits_; }
  // ...and the collectives its GPU had not finished.
  void set_gpu_open(std::vector<GpuOpen> open) { gpu_open_ = std::move(open); }
  const std::vector<GpuOpen>& gpu_open() const { return gpu_open_; }
  bool known() const { return !samples_.empty(); }
  bool alive() const { return samples_.empty() || samples_.back().alive; }
  char state() const { return samples_.empty() ? '?' : samples_.back().state; }
  // Shares over (about) the last `window_ns` of samples.
  CpuShares shares(uint64_t window_ns) const;
  // "alive, stopped (state T)", "exited", "alive, running"...
  std::string describe() const;
  // "off-CPU 94% of the last 60 s (waiting for a CPU 40%, ...)"; "" if unknown.
  std::string describe_cpu(uint64_t window_ns) const;
  const HealthSample* last() const { return samples_.empty() ? nullptr : &samples_.back(); }

 private:
  std::string describe_state() const;
  static constexpr size_t kSamples = 64;
  std::deque<HealthSample> samples_;
  std::vector<OpenWait> open_waits_;
  std::vector<GpuOpen> gpu_open_;
};

}  // namespace rankscope::collector
