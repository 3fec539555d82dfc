#pragma once
// What the overhead benchmark needs besides the loops themselves: robust
// statistics over repetitions, the CPU time of another process, child
// daemons that are always stopped, and whether a uprobe sits on a function.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace rankscope::bench {

// Median and range of a few repetitions.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread_of(std::vector<double> values);

// CPU time a process has used, all its threads together.
struct CpuTime {
  uint64_t stat_ticks = 0;   // utime + stime of /proc/PID/stat, in clock ticks (USER_HZ)
  uint64_t runtime_ns = 0;   // sum over /proc/PID/task/*/schedstat of the time on CPU
};
Result<CpuTime> cpu_time_of(pid_t pid);
// Clock ticks per second for CpuTime::stat_ticks.
uint64_t ticks_per_second();

// A daemon started for the benchmark: its output goes to `log_path`; the
// destructor stops it (SIGTERM, then SIGKILL after a grace period).
class Child {
 public:
  static Result<Child> start(const std::vector<std::string>& argv, const std::string& log_path);
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  ~Child();
  pid_t pid() const { return pid_; }
  bool running();
  // SIGTERM, wait up to `grace_ms`, then SIGKILL. Returns the exit status
  // (128 + signal when killed by one).
  int stop(int grace_ms);

 private:
  Child() = default;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;
};

// Whether a uprobe is installed on the function at `code` in this process:
// the kernel replaces the first instruction byte with int3 (0xCC) in every
// process that maps the probed file (kernel/events/uprobes.c).
bool has_breakpoint(const void* code);

// A TCP port free on 127.0.0.1 right now.
Result<int> free_port();

uint64_t monotonic_ns();

}  // namespace rankscope::bench
