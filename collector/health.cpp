#include "collector/health.h"

#include "common/format.h"

#include <cstring>

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
  out.running = static_cast<double>(last.cpu_ns - first->cpu_ns) / span;
  out.waiting = static_cast<double>(last.runqueue_ns - first->runqueue_ns) / span;
  out.known = true;
  return out;
}

std::string ProcessHealth::describe() const {
  if (samples_.empty()) return "state unknown (no report from its agent yet)";
  if (!alive()) {
    const HealthSample& last = samples_.back();
    if (last.exit_signal > 0) {
      const char* name = sigabbrev_np(last.exit_signal);
      return "exited: killed by signal " + std::to_string(last.exit_signal) + (name ? std::string(" (SIG") + name + ")" : "");
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
    case 'T': return "alive, stopped (SIGSTOP or job control, state T)";
    case 't': return "alive, stopped by a debugger (state t)";
    case 'D': return "alive, in uninterruptible sleep (I/O or driver, state D)";
    case 'Z': return "exited (zombie, state Z)";
    case 'R': return "alive, running";
    case 'S': return "alive, sleeping";
    default: return std::string("alive, state ") + state();
  }
}

}  // namespace rankscope::collector
