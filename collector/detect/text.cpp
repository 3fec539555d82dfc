// What findings say about a rank: its process, host context and neighbours.
#include <algorithm>
#include <cstdio>

#include "collector/detect/detector.h"
#include "common/format.h"
#include "common/stats.h"
#include "proto/records.h"

namespace rankscope::collector {

namespace {
// A neighbouring cgroup using at least this many CPUs is named in a
// straggler's host context.
constexpr double kBusyNeighbourCpus = 0.25;
// Communicators smaller than this compare a rank with its peers excluding
// it; larger ones with the median of all (cached per evaluation).
constexpr int32_t kPeerCacheMinRanks = 8;
}  // namespace

std::string Detector::describe_rank(const CommState& comm, int32_t rank, uint64_t now_ns) const {
  auto it = comm.members.find(rank);
  if (it == comm.members.end())
    return "rank " + std::to_string(rank) + ": never joined this communicator (no agent reported it)";
  const MemberState& m = it->second;
  std::string who = "pid " + std::to_string(m.pid);
  if (const ProcessInfo* process = model_.process(m.node, m.pid)) {
    std::string gpu = process->gpu();
    if (!gpu.empty()) who += ", GPU " + gpu;
    if (!process->user.empty()) who += ", user " + process->user;
    if (!process->account.empty()) who += ", account " + process->account;
    if (!process->slurm_step.empty()) who += ", step " + process->slurm_step;
    if (!process->pod_uid.empty()) who += ", pod " + process->pod_uid;
    if (!process->container_id.empty()) who += ", container " + process->container_id.substr(0, 12);
  }
  std::string text = "rank " + std::to_string(rank) + " on node " + m.node + " (" + who + ")";
  if (m.last_seq >= 0) {
    text += ": last collective #" + std::to_string(m.last_seq) + " issued at " + format_time_ns(m.last_issue_ns);
  } else {
    text += ": no collective issued yet";
  }
  if (m.error)
    text += "; NCCL reported its communicator broken at " + format_time_ns(m.error->ns) + " (" +
            proto::result_name(m.error->async_error ? m.error->async_error : m.error->result) + ")";
  const ProcessHealth* health = health_of(m);
  text += "; process " + (health ? health->describe() : std::string("state unknown"));
  std::string context = host_context(comm, rank);
  if (!context.empty()) text += "; " + context;
  return text;
}

std::string Detector::host_context(const CommState& comm, int32_t rank) const {
  auto it = comm.members.find(rank);
  if (it == comm.members.end()) return {};
  const ProcessHealth* health = health_of(it->second);
  if (!health) return {};
  CpuShares mine = health->shares(options_.context_window_ns);
  if (!mine.known) return {};
  // The peers' medians, once per communicator and evaluation: walking every
  // member's health for each rank explained is O(ranks^2) at scale. Past 8
  // ranks the median of all members stands for the median of the others.
  auto summarise = [&](int32_t except) {
    PeerShares p;
    std::vector<int64_t> running, waiting, off;
    for (const auto& [r, m] : comm.members) {
      if (r == except) continue;
      const ProcessHealth* peer = health_of(m);
      if (!peer) continue;
      CpuShares s = peer->shares(options_.context_window_ns);
      if (!s.known) continue;
      running.push_back(static_cast<int64_t>(s.running * 1000));
      waiting.push_back(static_cast<int64_t>(s.waiting * 1000));
      off.push_back(static_cast<int64_t>(s.off_cpu * 1000));
    }
    p.known = !running.empty();
    p.running = median(running) / 1000.0;
    p.waiting = median(waiting) / 1000.0;
    p.off_cpu = median(off) / 1000.0;
    return p;
  };
  PeerShares peers;
  if (comm.nranks < kPeerCacheMinRanks) {
    peers = summarise(rank);
  } else {
    auto cached = peer_cache_.find(comm.hash);
    if (cached == peer_cache_.end()) cached = peer_cache_.emplace(comm.hash, summarise(-1)).first;
    peers = cached->second;
  }
  std::string text = health->describe_cpu(options_.context_window_ns);
  if (peers.known) {
    if (mine.host)
      text += " (peers, median: off-CPU " + format_percent(peers.off_cpu) + ", waiting for a CPU " +
              format_percent(peers.waiting) + ")";
    else
      text +=
          " (peers, median: ran " + format_percent(peers.running) + ", waited " + format_percent(peers.waiting) + ")";
  }
  std::string neighbours = busy_neighbours(it->second);
  if (!neighbours.empty()) text += "; " + neighbours;
  return text;
}

std::string Detector::busy_neighbours(const MemberState& member) const {
  auto node = model_.nodes.find(member.node);
  if (node == model_.nodes.end()) return {};
  const ProcessInfo* process = model_.process(member.node, member.pid);
  uint64_t own = process ? process->cgroup_id : 0;
  // Other ranks' cgroups on the node are the job itself, not neighbours.
  std::set<uint64_t> job_cgroups{own};
  for (const auto& [pid, health] : node->second.health)
    if (const ProcessInfo* other = model_.process(member.node, pid))
      if (process && other->job == process->job) job_cgroups.insert(other->cgroup_id);
  std::vector<std::pair<double, std::string>> busy;
  for (const auto& [id, usage] : node->second.cgroups) {
    if (job_cgroups.count(id)) continue;
    auto rate = usage.rate(node->second.last_monotonic_ns, options_.context_window_ns);
    if (!rate.known || rate.cpus < kBusyNeighbourCpus) continue;
    std::string name = usage.path.empty() ? "cgroup " + std::to_string(id) : usage.path;
    busy.emplace_back(rate.cpus, name);
  }
  if (busy.empty()) return {};
  std::sort(busy.begin(), busy.end(), std::greater<>());
  std::string text = "busiest other cgroups on " + member.node + ": ";
  for (size_t i = 0; i < busy.size() && i < 3; ++i) {
    char cpus[32];
    snprintf(cpus, sizeof(cpus), "%.1f", busy[i].first);
    text += (i ? ", " : "") + busy[i].second + " " + cpus + " CPUs";
  }
  return text;
}

}  // namespace rankscope::collector
