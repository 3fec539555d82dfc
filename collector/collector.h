#pragma once
#include <atomic>

#include "collector/options.h"

namespace rankscope::collector {

// Runs the collector until `stop` becomes true; returns the exit code.
int run(const Options& options, const std::atomic<bool>& stop);

}  // namespace rankscope::collector
