#pragma once
// Who else used this host: the per-cgroup rows of the BPF host-context probes
// turned into the heartbeat's CgroupUsage list (the cgroups busy since the
// last heartbeat, busiest first, with their paths).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bpf/nccl_events.h"
#include "proto/agent.capnp.h"

namespace rankscope::agent {

// cgroup v2 id (the directory's inode) -> path below the mount, cached; an
// unknown id triggers one walk of the hierarchy (at most once per round).
class CgroupNames {
 public:
  explicit CgroupNames(std::optional<std::string> mount);
  // "" if the cgroup is gone (or the hierarchy is not mounted).
  std::string path_of(uint64_t id);
  // Allows one more walk on the next miss.
  void new_round() { walked_since_miss_ = false; }

 private:
  void walk();
  std::optional<std::string> mount_;
  std::map<uint64_t, std::string> paths_;
  bool walked_since_miss_ = false;
};

class CgroupReport {
 public:
  static constexpr size_t kMaxRows = 32;
  explicit CgroupReport(std::optional<std::string> mount) : names_(std::move(mount)) {}
  // rows: cumulative counters per cgroup id (NcclProbes::cgroup_stats()).
  void fill(const std::vector<std::pair<uint64_t, rs_cgroup_stats>>& rows,
            ::rankscope::proto::wire::Heartbeat::Builder heartbeat);

 private:
  CgroupNames names_;
  std::map<uint64_t, rs_cgroup_stats> last_;  // what the previous heartbeat saw
};

}  // namespace rankscope::agent
