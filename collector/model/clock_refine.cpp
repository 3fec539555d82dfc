#include "collector/model/clock_refine.h"

#include <algorithm>

#include "common/stats.h"

namespace rankscope::collector {

void ClockRefiner::Recent::push(uint64_t seq, uint64_t ns) {
  if (size_ < kIssueHistory) {
    at_[(first_ + size_++) % kIssueHistory] = {seq, ns};
  } else {
    at_[first_] = {seq, ns};
    first_ = (first_ + 1) % kIssueHistory;
  }
}

void ClockRefiner::on_issues(const CommState& comm, int32_t rank, uint32_t lane, std::span<const Issue> issues) {
  if (lane != 0 || comm.nranks < 2 || rank < 0 || rank >= comm.nranks) return;
  CommTrack& track = comms_[comm.hash];
  if (track.ranks.size() < static_cast<size_t>(comm.nranks)) track.ranks.resize(static_cast<size_t>(comm.nranks));
  std::unique_ptr<RankIssues>& seen = track.ranks[static_cast<size_t>(rank)];
  if (!seen) seen = std::make_unique<RankIssues>();
  RankIssues& known = *seen;
  if (auto member = comm.members.find(rank); member != comm.members.end() && member->second.pid != known.pid) {
    known.pid = member->second.pid;
    members_of_[{member->second.node, member->second.pid}].emplace_back(comm.hash, rank);
  }
  for (const Issue& issue : issues)
    if (known.issues.empty() || known.issues.back().first < issue.seq) known.issues.push(issue.seq, issue.issue_ns);
}

void ClockRefiner::on_complete(const CollectiveComplete& done) {
  if (done.comm.nranks < 2) return;
  comms_[done.comm.hash].last_arrival.push(done.seq, *std::max_element(done.issue.begin(), done.issue.end()));
}

void ClockRefiner::on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) {
  auto process = members_of_.find(std::pair<std::string_view, uint32_t>(node, pid));
  if (process == members_of_.end()) return;
  // Each (communicator, rank) the process is, looked up once for the block;
  // its state is its own, so taking it before the next is as taking each
  // wait through all of them.
  for (const auto& [hash, rank] : process->second) {
    auto it = model_.comms.find(hash);
    if (it == model_.comms.end()) continue;
    const CommState& comm = it->second;
    if (comm.ended || comm.nranks < 2) continue;
    auto member = comm.members.find(rank);
    if (member == comm.members.end() || member->second.pid != pid || member->second.node != node) continue;
    auto track = comms_.find(hash);
    if (track == comms_.end()) continue;
    if (rank < 0 || static_cast<size_t>(rank) >= track->second.ranks.size() || !track->second.ranks[rank]) continue;
    RankIssues& known = *track->second.ranks[static_cast<size_t>(rank)];
    const Recent& issues = known.issues;
    for (const HostWait& wait : waits) {
      // The wait follows the last collective this rank issued before it began.
      size_t i = issues.size();
      while (i > 0 && issues[i - 1].second >= wait.start_ns) --i;
      if (i == 0) continue;
      uint64_t seq = issues[i - 1].first;
      // Only the first wait after it counts.
      if (known.joined == seq) continue;
      known.joined = seq;
      Group& group = track->second.groups[seq];
      group.ends.emplace_back(rank, wait.end_ns);
      if (group.ends.size() == static_cast<size_t>(comm.nranks)) {
        complete(comm, track->second, seq, group);
        track->second.groups.erase(seq);
      }
      while (track->second.groups.size() > kOpenGroups) track->second.groups.erase(track->second.groups.begin());
    }
  }
}

void ClockRefiner::complete(const CommState& comm, CommTrack& track, uint64_t seq, const Group& group) {
  // The collective's last arrival: nobody can have left before it (0: the
  // instance did not complete, its ranks called different things).
  uint64_t last_arrival = 0;
  for (size_t i = track.last_arrival.size(); i > 0; --i)
    if (track.last_arrival[i - 1].first == seq) {
      last_arrival = track.last_arrival[i - 1].second;
      break;
    }
  // Residuals are taken on the probes' clocks alone (the refinement now
  // applied removed), so that they do not move as the refinement does.
  // Each rank's end with its node's name, sorted by node: one run per node.
  scratch_ends_.clear();
  for (const auto& [rank, end] : group.ends) {
    auto member = comm.members.find(rank);
    if (member == comm.members.end()) return;
    const std::string& node = member->second.node;
    if (last_arrival && end < last_arrival) violations_[node] += 1;
    scratch_ends_.emplace_back(&node, static_cast<int64_t>(end));
  }
  std::sort(scratch_ends_.begin(), scratch_ends_.end(),
            [](const auto& a, const auto& b) { return *a.first < *b.first; });
  scratch_raw_.clear();
  size_t nodes = 0;
  for (size_t i = 0; i < scratch_ends_.size();) {
    const std::string& node = *scratch_ends_[i].first;
    int64_t refinement = applied(node);
    for (; i < scratch_ends_.size() && *scratch_ends_[i].first == node; ++i) {
      scratch_ends_[i].second -= refinement;
      scratch_raw_.push_back(scratch_ends_[i].second);
    }
    ++nodes;
  }
  if (nodes < 2) return;  // one node: nothing to align
  int64_t middle = median(scratch_raw_);
  for (size_t i = 0; i < scratch_ends_.size();) {
    const std::string& node = *scratch_ends_[i].first;
    scratch_node_.clear();
    for (; i < scratch_ends_.size() && *scratch_ends_[i].first == node; ++i)
      scratch_node_.push_back(scratch_ends_[i].second);
    auto ring = residuals_.find(node);
    if (ring == residuals_.end()) ring = residuals_.emplace(node, std::deque<int64_t>()).first;
    ring->second.push_back(median(scratch_node_) - middle);
    while (ring->second.size() > kResiduals) ring->second.pop_front();
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
