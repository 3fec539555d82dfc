#pragma once
// A Hello as the agent builds it (proto/agent_wire.h): the one the tests send.
#include <cstdint>
#include <string>

#include "proto/agent_wire.h"

namespace rankscope::testing {

inline std::string hello_message(const std::string& node, uint64_t instance, uint64_t realtime_ns = 0,
                                 uint64_t monotonic_ns = 0) {
  proto::Hello hello;
  hello.node = node;
  hello.instance_id = instance;
  hello.monotonic_ns = monotonic_ns;
  hello.realtime_ns = realtime_ns;
  return proto::encode_hello(hello);
}

}  // namespace rankscope::testing
