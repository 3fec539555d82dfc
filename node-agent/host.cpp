#include "node-agent/host.h"

#include <ftw.h>

#include <algorithm>
#include <cstring>

#include "proto/limits.h"

namespace rankscope::agent {

namespace {
// nftw has no user pointer: the walk in progress.
std::map<uint64_t, std::string>* g_walk_into = nullptr;
size_t g_walk_prefix = 0;

int visit(const char* path, const struct stat* st, int type, FTW*) {
  if (type == FTW_D && g_walk_into) {
    std::string below(path + std::min(g_walk_prefix, strlen(path)));
    // A user with a delegated subtree names its cgroups: a path past the
    // bound is known as "" (not reported: the collector would not keep
    // it; known, so that it does not make every heartbeat walk again).
    (*g_walk_into)[st->st_ino] = below.size() > proto::kMaxIdentityPath ? "" : below.empty() ? "/" : below;
  }
  return 0;
}
}  // namespace

CgroupNames::CgroupNames(std::optional<std::string> mount) : mount_(std::move(mount)) {}

void CgroupNames::walk() {
  if (!mount_) return;
  std::map<uint64_t, std::string> found;
  g_walk_into = &found;
  g_walk_prefix = mount_->size();
  nftw(mount_->c_str(), visit, 16, FTW_PHYS | FTW_MOUNT);
  g_walk_into = nullptr;
  paths_ = std::move(found);
}

std::string CgroupNames::path_of(uint64_t id) {
  auto it = paths_.find(id);
  if (it != paths_.end()) return it->second;
  if (!walked_since_miss_) {
    walk();
    walked_since_miss_ = true;
    it = paths_.find(id);
    if (it != paths_.end()) return it->second;
  }
  return {};
}

void CgroupReport::fill(const std::vector<std::pair<uint64_t, rs_cgroup_stats>>& rows,
                        ::rankscope::proto::wire::Heartbeat::Builder heartbeat) {
  struct Busy {
    uint64_t id;
    rs_cgroup_stats now;
    uint64_t cpu_delta;
    bool retransmits;
  };
  std::vector<Busy> busy;
  std::map<uint64_t, rs_cgroup_stats> seen;
  for (const auto& [id, row] : rows) {
    seen[id] = row;
    auto before = last_.find(id);
    uint64_t cpu_before = before == last_.end() ? 0 : before->second.cpu_ns;
    uint64_t retrans_before = before == last_.end() ? 0 : before->second.tcp_retransmits;
    uint64_t cpu_delta = row.cpu_ns > cpu_before ? row.cpu_ns - cpu_before : 0;
    bool retransmits = row.tcp_retransmits > retrans_before;
    if (cpu_delta > 0 || retransmits) busy.push_back(Busy{id, row, cpu_delta, retransmits});
  }
  last_ = std::move(seen);
  // Retransmits are rare and telling: rows that have them go first, then CPU.
  std::sort(busy.begin(), busy.end(), [](const Busy& a, const Busy& b) {
    return a.retransmits != b.retransmits ? a.retransmits : a.cpu_delta > b.cpu_delta;
  });
  if (busy.size() > kMaxRows) busy.resize(kMaxRows);
  auto list = heartbeat.initCgroups(static_cast<unsigned>(busy.size()));
  names_.new_round();  // a miss walks the hierarchy once per heartbeat at most
  for (unsigned i = 0; i < busy.size(); ++i) {
    list[i].setCgroupId(busy[i].id);
    list[i].setPath(names_.path_of(busy[i].id));
    list[i].setCpuNs(busy[i].now.cpu_ns);
    list[i].setInvoluntarySwitches(busy[i].now.involuntary_switches);
    list[i].setTcpRetransmits(busy[i].now.tcp_retransmits);
  }
}

}  // namespace rankscope::agent
