#pragma once
// What a fakenccl-train rank says it did (--record FILE), for tests that
// compare it with what the collector stored.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "proto/records.h"

namespace rankscope::testing {

struct MadeCall {
  std::string op;
  uint64_t count;
  std::string datatype;
  uint64_t bytes;
};

// The calls a rank made, as fakenccl-train --record wrote them:
// "<index> <op> <count> <datatype> <bytes>"; only collectives are kept.
inline std::vector<MadeCall> read_made_calls(const std::string& path) {
  std::vector<MadeCall> calls;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    uint64_t index;
    MadeCall call;
    if (!(fields >> index >> call.op >> call.count >> call.datatype >> call.bytes)) continue;
    if (proto::op_is_collective(proto::op_from_name(call.op))) calls.push_back(call);
  }
  return calls;
}

}  // namespace rankscope::testing
