#pragma once
// `rankscope-agent check`: can this node be traced, and what would be? In
// words a new user can act on. Loads and attaches the real probes, then
// lets go of them.
#include <iosfwd>

#include "node-agent/options.h"

namespace rankscope::agent {

// Prints the report to `out`; returns 0 when the node is ready, 1 otherwise.
int run_check(const Options& options, std::ostream& out);

}  // namespace rankscope::agent
