#include "collector/model/health.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/format.h"

namespace rankscope::collector {

void ProcessHealth::add(const HealthSample& sample) {
  samples_.push_back(sample);
  if (samples_.size() > kSamples) samples_.pop_front();
}

CpuShares ProcessHealth::shares(uint64_t window_ns) const {
  CpuShares out;
  if (samples_.size() < 2 || !samples_.back().alive) return out;
  const HealthSample& last = samples_.back();
  const HealthSample* first = nullptr;
  for (auto it = samples_.rbegin(); it != samples_.rend(); ++it) {
    if (!it->alive) break;
    first = &*it;
    if (last.sample_ns - it->sample_ns >= window_ns) break;
  }
  if (!first || first == &last || last.sample_ns <= first->sample_ns) return out;
  double span = static_cast<double>(last.sample_ns - first->sample_ns);
  auto delta = [](uint64_t a, uint64_t b) { return a > b ? static_cast<double>(a - b) : 0.0; };
  out.running = delta(last.cpu_ns, first->cpu_ns) / span;
  out.waiting = delta(last.runqueue_ns, first->runqueue_ns) / span;
  out.known = true;
  out.quota_millicpus = last.cpu_quota_millicpus;
  if (double periods = delta(last.cpu_periods, first->cpu_periods); periods > 0) {
    out.throttled_periods = std::min(1.0, delta(last.cpu_throttled_periods, first->cpu_throttled_periods) / periods);
    out.throttled = std::min(1.0, delta(last.cpu_throttled_ns, first->cpu_throttled_ns) / span);
  }
  if (last.host_known && first->host_known) {
    // The counters sum over the calling threads: shares are per thread.
    double per_thread = span * std::max<uint32_t>(1, last.threads);
    out.host = true;
    out.running = delta(last.on_cpu_ns, first->on_cpu_ns) / per_thread;
    out.waiting = delta(last.host_runqueue_ns, first->host_runqueue_ns) / per_thread;
    out.off_cpu = delta(last.off_cpu_ns, first->off_cpu_ns) / per_thread;
    out.iowait = delta(last.iowait_ns, first->iowait_ns) / per_thread;
    out.involuntary_switches = static_cast<uint64_t>(delta(last.involuntary_switches, first->involuntary_switches));
    out.major_faults = static_cast<uint64_t>(delta(last.major_faults, first->major_faults));
    out.process_cpus = delta(last.process_cpu_ns, first->process_cpu_ns) / span;
  }
  return out;
}

namespace {
// Shares of a window, which sampling can round past its ends.
std::string percent(double share) {
  return format_percent(std::clamp(share, 0.0, 1.0));
}
// "; its cgroup's CPU quota (0.15 CPUs) throttled it in 85% of its periods,
// 84% of the time": the cause a run-queue wait does not show (a throttled
// cgroup's threads are not runnable while throttled).
std::string throttling(const CpuShares& s) {
  if (s.throttled_periods <= 0) return {};
  char quota[48] = "";
  if (s.quota_millicpus > 0) snprintf(quota, sizeof(quota), " (%.2f CPUs)", s.quota_millicpus / 1000.0);
  return std::string("; its cgroup's CPU quota") + quota + " throttled it in " + percent(s.throttled_periods) +
         " of the quota's periods, " + percent(s.throttled) + " of the time";
}
}  // namespace

std::string ProcessHealth::describe_cpu(uint64_t window_ns) const {
  CpuShares s = shares(window_ns);
  if (!s.known) return {};
  const HealthSample& last = samples_.back();
  const HealthSample* first = &last;
  for (auto it = samples_.rbegin(); it != samples_.rend() && it->alive; ++it) {
    first = &*it;
    if (last.sample_ns - it->sample_ns >= window_ns) break;
  }
  std::string span = format_duration_ns(last.sample_ns - first->sample_ns);
  if (!s.host)
    return "its main thread ran " + percent(s.running) + " and waited for a CPU " + percent(s.waiting) +
           " of the last " + span + throttling(s);
  std::string text = "off-CPU " + percent(s.off_cpu) + " of the last " + span + " (waiting for a CPU " +
                     percent(s.waiting) + ", on block I/O " + percent(s.iowait) + "), preempted " +
                     std::to_string(s.involuntary_switches) + " times";
  if (s.major_faults) text += ", " + std::to_string(s.major_faults) + " major page faults";
  return text + throttling(s);
}

std::string ProcessHealth::describe() const {
  if (samples_.empty()) return "state unknown (no report from its agent yet)";
  if (!alive()) {
    const HealthSample& last = samples_.back();
    if (last.exit_signal > 0) {
      const char* name = sigabbrev_np(last.exit_signal);
      return "exited: killed by signal " + std::to_string(last.exit_signal) +
             (name ? std::string(" (SIG") + name + ")" : "");
    }
    if (last.exit_status >= 0) return "exited with status " + std::to_string(last.exit_status);
    return "exited";
  }
  std::string text = describe_state();
  for (const auto& wait : open_waits_) text += ", blocked in " + wait.call + " since " + format_time_ns(wait.since_ns);
  return text;
}

std::string ProcessHealth::describe_state() const {
  switch (state()) {
    case 'T':
      return "alive, stopped (SIGSTOP or job control, state T)";
    case 't':
      return "alive, stopped by a debugger (state t)";
    case 'D':
      return "alive, in uninterruptible sleep (I/O or driver, state D)";
    case 'Z':
      return "exited (zombie, state Z)";
    case 'R':
      return "alive, running";
    case 'S':
      return "alive, sleeping";
    default:
      return std::string("alive, state ") + state();
  }
}

}  // namespace rankscope::collector
