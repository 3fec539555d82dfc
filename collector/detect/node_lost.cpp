// The node-lost detector: agents with live communicators that went silent.
#include <algorithm>

#include "collector/detect/detector.h"
#include "collector/detect/text.h"
#include "common/format.h"

namespace rankscope::collector {

void Detector::evaluate_nodes(uint64_t now_ns) {
  // Which live ranks (and jobs) each node runs, gathered only when some node
  // is silent, in one pass over the members (not one pass per node).
  std::map<std::string, std::pair<std::vector<int32_t>, std::set<std::string>>> ran;
  bool gathered = false;
  for (const auto& [name, node] : model_.nodes) {
    // After a restart, a node's last contact is at least our own start.
    uint64_t heard = std::max(node.last_contact_ns, model_.started_ns);
    if (!silent_for(node, now_ns, options_.node_lost_timeout_ns)) {
      if (open_lost_.count(name)) {
        Finding f;
        f.kind = FindingKind::node_lost;
        f.nodes = {name};
        book_.resolve(f.key(), now_ns);
      }
      folded_told_.erase(name);
      continue;
    }
    Finding f;
    f.kind = FindingKind::node_lost;
    f.nodes = {name};
    if (!gathered) {
      for (const auto& [hash, comm] : model_.comms) {
        if (comm.ended) continue;
        for (const auto& [rank, m] : comm.members) {
          const ProcessHealth* health = health_of(m);
          if (health && !health->alive()) continue;
          auto& [ranks, jobs] = ran[m.node];
          if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) ranks.push_back(rank);
          jobs.insert(comm.job);
        }
      }
      gathered = true;
    }
    std::set<std::string> jobs;
    if (auto it = ran.find(name); it != ran.end()) {
      f.ranks = it->second.first;
      jobs = it->second.second;
    }
    if (f.ranks.empty()) continue;  // nothing of value ran there
    std::sort(f.ranks.begin(), f.ranks.end());
    for (const auto& job : jobs) f.job += (f.job.empty() ? "" : ",") + job;
    f.summary = "node " + name + " lost: its agent has been silent since " + format_time_ns(heard) +
                "; it ran rank(s) " + join(f.ranks) + " of job " + f.job;
    f.detail = f.summary + ".\nLast contact " + format_time_ns(node.last_contact_ns) +
               ". The node, its network or its agent is down; rankscope cannot see these ranks until it returns.";
    size_t& told = folded_told_[name];  // only grows while the node stays lost: no rewrite every tick
    if (auto folded = folded_.find(name); folded != folded_.end()) told = std::max(told, folded->second.size());
    if (told > 0)
      f.detail += "\nThe other ranks of " + std::to_string(told) +
                  " communicator(s) wait on these unseen ranks; those waits are not reported as separate hangs.";
    book_.raise(std::move(f), now_ns);
  }
}

}  // namespace rankscope::collector
