#pragma once
#include <string>

#include "tools/sim/model.h"

namespace rankscope::sim {

struct RunOptions {
  std::string collector = "tcp://127.0.0.1:7600";
  std::string truth;              // JSON lines; the collector never sees it
  double duration_s = 30;
  double nominal_step_s = 1.0;    // the real step time one simulated step stands for (job-time conversion)
};

// Runs the fleet against the collector in real time for `duration_s`, then
// writes the ground truth. Returns the exit code.
int run_fleet(const FleetConfig& config, const RunOptions& options);

}  // namespace rankscope::sim
