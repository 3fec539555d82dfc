#include "collector/model/clock_refine.h"

#include <algorithm>

#include "common/stats.h"

namespace rankscope::collector {

void ClockRefiner::on_issue(const CommState& comm, int32_t rank, uint32_t lane, uint64_t seq, uint64_t issue_ns) {
  if (lane != 0 || comm.nranks < 2 || rank < 0) return;
  RankIssues& known = comms_[comm.hash].ranks[rank];
  auto& issues = known.issues;
  if (auto member = comm.members.find(rank); member != comm.members.end() && member->second.pid != known.pid) {
    known.pid = member->second.pid;
    members_of_[{member->second.node, member->second.pid}].emplace_back(comm.hash, rank);
  }
  if (!issues.empty() && issues.back().first >= seq) return;
  issues.emplace_back(seq, issue_ns);
  while (issues.size() > kIssueHistory) issues.pop_front();
}

void ClockRefiner::on_complete(const CollectiveComplete& done) {
  if (done.comm.nranks < 2) return;
  auto& arrivals = comms_[done.comm.hash].last_arrival;
  arrivals[done.seq] = *std::max_element(done.issue.begin(), done.issue.end());
  while (arrivals.size() > kIssueHistory) arrivals.erase(arrivals.begin());
}

void ClockRefiner::on_wait(const std::string& node, uint32_t pid, uint64_t start_ns, uint64_t end_ns) {
  auto process = members_of_.find({node, pid});
  if (process == members_of_.end()) return;
  for (const auto& [hash, rank] : process->second) {
    auto it = model_.comms.find(hash);
    if (it == model_.comms.end()) continue;
    const CommState& comm = it->second;
    if (comm.ended || comm.nranks < 2) continue;
    auto member = comm.members.find(rank);
    if (member == comm.members.end() || member->second.pid != pid || member->second.node != node) continue;
    auto track = comms_.find(hash);
    if (track == comms_.end()) continue;
    auto& issues = track->second.ranks[rank].issues;
    // The wait follows the last collective this rank issued before it began.
    auto after = std::find_if(issues.rbegin(), issues.rend(), [&](const auto& i) { return i.second < start_ns; });
    if (after == issues.rend()) continue;
    uint64_t seq = after->first;
    Group& group = track->second.groups[seq];
    group.ends.emplace(rank, end_ns);  // the first wait after it
    if (group.ends.size() == static_cast<size_t>(comm.nranks)) {
      complete(comm, track->second, seq, group);
      track->second.groups.erase(seq);
    }
    while (track->second.groups.size() > kOpenGroups) track->second.groups.erase(track->second.groups.begin());
  }
}

void ClockRefiner::complete(const CommState& comm, CommTrack& track, uint64_t seq, const Group& group) {
  // The collective's last arrival: nobody can have left before it (0: the
  // instance did not complete, its ranks called different things).
  auto arrival = track.last_arrival.find(seq);
  uint64_t last_arrival = arrival == track.last_arrival.end() ? 0 : arrival->second;
  // Residuals are taken on the probes' clocks alone (the refinement now
  // applied removed), so that they do not move as the refinement does.
  std::vector<int64_t> raw_ends;
  std::map<std::string, std::vector<int64_t>> by_node;
  for (const auto& [rank, end] : group.ends) {
    auto member = comm.members.find(rank);
    if (member == comm.members.end()) return;
    const std::string& node = member->second.node;
    if (last_arrival && end < last_arrival) violations_[node] += 1;
    int64_t raw = static_cast<int64_t>(end) - applied(node);
    raw_ends.push_back(raw);
    by_node[node].push_back(raw);
  }
  if (by_node.size() < 2) return;  // one node: nothing to align
  int64_t middle = median(raw_ends);
  for (auto& [node, ends] : by_node) {
    auto& ring = residuals_[node];
    ring.push_back(median(ends) - middle);
    while (ring.size() > kResiduals) ring.pop_front();
  }
}

void ClockRefiner::forget_retired() {
  // Communicators out of the live model (ended, or retired by the ingest),
  // and the processes that were their members.
  bool any = false;
  for (auto it = comms_.begin(); it != comms_.end();) {
    bool keep = model_.live(it->first);
    any |= !keep;
    it = keep ? std::next(it) : comms_.erase(it);
  }
  if (!any) return;
  for (auto it = members_of_.begin(); it != members_of_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(), [&](const auto& m) { return !comms_.count(m.first); }),
               list.end());
    it = list.empty() ? members_of_.erase(it) : std::next(it);
  }
}

ClockAdjustments ClockRefiner::update() {
  forget_retired();
  ClockAdjustments out;
  out.violations = std::move(violations_);
  violations_.clear();
  std::map<std::string, int64_t> target;
  for (const auto& [node, ring] : residuals_) {
    if (ring.size() < kMinResiduals) continue;
    target[node] = -median(std::vector<int64_t>(ring.begin(), ring.end()));
  }
  if (target.size() < 2) return out;
  // Anchor: the nodes' mean stays where the probes put it.
  int64_t mean = 0;
  for (const auto& [node, t] : target) mean += t;
  mean /= static_cast<int64_t>(target.size());
  for (const auto& [node, t] : target) {
    const NodeState* state = model_.node(node);
    if (!state) continue;
    // Within what the probes allow: they bound the offset, the collectives
    // choose inside the bound.
    int64_t bound = static_cast<int64_t>(std::min<uint64_t>(state->clock.probe_uncertainty_ns(), 1'000'000'000ull));
    out.refinement_ns[node] = std::clamp(t - mean, -bound, bound);
  }
  return out;
}

int64_t ClockRefiner::applied(const std::string& node) const {
  const NodeState* state = model_.node(node);
  return state ? state->clock.refinement_ns() : 0;
}

}  // namespace rankscope::collector
