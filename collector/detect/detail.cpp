#include "collector/detect/detail.h"

#include <algorithm>
#include <set>

namespace rankscope::collector {

namespace {
// Kernel times come from the user's plugin: each is taken as at most an hour.
constexpr uint64_t kMaxNs = 3'600'000'000'000ull;

uint64_t median_of(std::vector<uint64_t> v, size_t at) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
  return v[at];
}
}  // namespace

DetailPolicy::DetailPolicy(const ClusterModel& model, const FindingBook& book, const LinkDetector& links,
                           DetailOptions options)
    : model_(model), book_(book), links_(links), options_(options) {}

void DetailPolicy::on_gpu_complete(const GpuComplete& done) {
  const int32_t n = done.comm.nranks;
  uint64_t shortest = UINT64_MAX;
  for (int32_t r = 0; r < n; ++r) {
    // Every rank's kernels seen (a start of 1 is the matcher's "not seen"),
    // or the last arrival's may be the one missing.
    if (done.kernel_start[r] <= 1 || done.kernel_end[r] <= done.kernel_start[r]) return;
    shortest = std::min(shortest, std::min(done.kernel_end[r] - done.kernel_start[r], kMaxNs));
  }
  const Key key{done.comm.hash, done.op, done.count};
  auto it = shortest_.find(key);
  if (it == shortest_.end()) {
    size_t& keys = keys_[done.comm.hash];
    if (keys >= options_.keys_per_comm) return;
    ++keys;
    it = shortest_.emplace(key, std::deque<uint64_t>{}).first;
  }
  auto& history = it->second;
  history.push_back(shortest);
  while (history.size() > options_.history) history.pop_front();
  if (history.size() < options_.recent + options_.min_baseline) return;
  const auto split = history.end() - static_cast<std::ptrdiff_t>(options_.recent);
  const uint64_t recent = median_of(std::vector<uint64_t>(split, history.end()), options_.recent / 2);
  std::vector<uint64_t> before(history.begin(), split);
  const uint64_t baseline = median_of(std::move(before), (history.size() - options_.recent) / 4);
  if (recent >= baseline + options_.floor_ns &&
      static_cast<double>(recent) >= options_.rise * static_cast<double>(baseline))
    rose_[done.comm.hash] = true;
}

void DetailPolicy::want(uint64_t comm, Reason reason, uint64_t at_ns) {
  auto [it, made] = wanted_.try_emplace(comm);
  if (made) {
    switch (reason) {
      case Reason::finding: ++counts_.finding; break;
      case Reason::link: ++counts_.link; break;
      case Reason::rise: ++counts_.rise; break;
    }
    it->second.reason = reason;
  }
  it->second.until_ns = std::max(it->second.until_ns, at_ns + options_.hold_ns);
}

void DetailPolicy::evaluate(uint64_t now_ns) {
  auto live = [&](uint64_t hash) {
    auto comm = model_.comms.find(hash);
    return comm != model_.comms.end() && !comm->second.ended;
  };
  for (auto it = shortest_.begin(); it != shortest_.end();) {
    const uint64_t hash = std::get<0>(it->first);
    if (live(hash)) {
      ++it;
      continue;
    }
    keys_.erase(hash);
    it = shortest_.erase(it);
  }
  for (const Finding* f : book_.open())
    if (f->kind == FindingKind::straggler || f->kind == FindingKind::slow_link || f->kind == FindingKind::hang)
      if (live(f->comm)) want(f->comm, Reason::finding, now_ns);
  for (const auto& [hash, comm] : model_.comms)
    if (!comm.ended)
      if (const uint64_t at = std::min(links_.suspected_at(hash), now_ns); at && at + options_.hold_ns > now_ns)
        want(hash, Reason::link, at);  // held from the sample, not from now: an idle communicator is let go
  for (const auto& [hash, rose] : rose_)
    if (live(hash)) want(hash, Reason::rise, now_ns);
  rose_.clear();
  for (auto it = wanted_.begin(); it != wanted_.end();)
    it = it->second.until_ns <= now_ns || !live(it->first) ? wanted_.erase(it) : std::next(it);

  std::map<std::string, std::set<uint64_t>> nodes;
  for (const auto& [hash, w] : wanted_)
    for (const auto& [rank, member] : model_.comms.at(hash).members)
      if (!member.node.empty()) nodes[member.node].insert(hash);
  by_node_.clear();
  for (auto& [node, comms] : nodes) by_node_[node].assign(comms.begin(), comms.end());
}

}  // namespace rankscope::collector
