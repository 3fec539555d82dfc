#pragma once
// The wire's side of common/drops.h: each row of kDropReasons bound to its
// field of wire::DropCounters, in the same order (a test holds the two
// against the schema).
#include "common/drops.h"
#include "proto/agent.capnp.h"

namespace rankscope::proto {

DropCounts read_drops(wire::DropCounters::Reader in);
void write_drops(const DropCounts& in, wire::DropCounters::Builder out);

}  // namespace rankscope::proto
