#pragma once
// How findings are worded, shared by the detectors' passes.
#include <cstdint>
#include <string>
#include <vector>

#include "collector/model/cluster.h"
#include "common/format.h"

namespace rankscope::collector {

// At most kJoined of them: a communicator may have 65,536 ranks, and a
// finding that names them all is neither readable nor small.
inline constexpr size_t kJoined = 64;
inline std::string join(const std::vector<int32_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size() && i < kJoined; ++i) out += (out.empty() ? "" : ",") + std::to_string(values[i]);
  if (values.size() > kJoined) out += " and " + std::to_string(values.size() - kJoined) + " more";
  return out;
}
inline std::string short_comm(uint64_t comm) {
  return hex64(comm).substr(0, 8);
}
// How every finding of a communicator starts: "hang in job 4711, comm 1a2b3c4d".
inline std::string where(const char* kind, const CommState& comm) {
  return std::string(kind) + " in job " + comm.job + ", comm " + short_comm(comm.hash);
}

}  // namespace rankscope::collector
