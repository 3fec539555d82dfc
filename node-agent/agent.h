#pragma once
#include <atomic>

#include "node-agent/options.h"

namespace rankscope::agent {

// Runs the agent until `stop` becomes true. Returns the process exit code;
// start-up failures are logged with what to do about them.
int run(const Options& options, const std::atomic<bool>& stop);

}  // namespace rankscope::agent
