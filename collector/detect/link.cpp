#include "collector/detect/link.h"

#include <algorithm>
#include <vector>

#include "common/format.h"

namespace rankscope::collector {

namespace {
// Times from an agent are the user's (their plugin writes them): each is
// taken as at most an hour, so that the window's sums cannot wrap.
constexpr uint64_t kMaxNs = 3'600'000'000'000ull;
uint64_t bounded(uint64_t ns) { return std::min(ns, kMaxNs); }
}  // namespace

LinkDetector::LinkDetector(const ClusterModel& model, FindingBook& book, LinkOptions options)
    : model_(model), book_(book), options_(options) {}

void LinkDetector::on_gpu_complete(const GpuComplete& done) {
  const int32_t n = done.comm.nranks;
  int32_t top = -1, seen = 0;
  // Its end: the earliest rank's (a node whose clock runs ahead, or lies,
  // cannot make the sample look newer than it is).
  uint64_t kernel_ns = 0, ended_ns = UINT64_MAX;
  for (int32_t r = 0; r < n; ++r) {
    if (done.kernel_end[r] != 0) ended_ns = std::min(ended_ns, done.kernel_end[r]);
    if (done.kernel_end[r] > done.kernel_start[r])
      kernel_ns = std::max(kernel_ns, bounded(done.kernel_end[r] - done.kernel_start[r]));
    if (done.link_peer[r] < 0) continue;
    ++seen;
    if (top < 0 || done.link_wait[r] > done.link_wait[top]) top = r;
  }
  if (seen < 2) return;  // no proxy steps asked for, or one rank's alone: nothing to compare
  std::vector<uint64_t> others;
  for (int32_t r = 0; r < n; ++r)
    if (r != top && done.link_peer[r] >= 0) others.push_back(bounded(done.link_wait[r]));
  std::nth_element(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(others.size() / 2), others.end());
  Sample s;
  s.others_ns = others[others.size() / 2];
  s.kernel_ns = kernel_ns;
  s.ended_ns = ended_ns == UINT64_MAX ? 0 : ended_ns;
  const uint64_t wait = bounded(done.link_wait[top]);
  if (wait >= s.others_ns + options_.floor_ns &&
      static_cast<double>(wait) >= options_.ratio * static_cast<double>(s.others_ns)) {
    s.rank = top;
    s.peer = done.link_peer[top];
    s.wait_ns = wait;
  }
  auto& window = comms_[done.comm.hash].window;
  window.push_back(s);
  while (window.size() > options_.window) window.pop_front();
}

uint64_t LinkDetector::suspected_at(uint64_t comm) const {
  auto it = comms_.find(comm);
  if (it == comms_.end()) return 0;
  const auto& window = it->second.window;
  const size_t n = std::min(window.size(), options_.min_collectives);
  uint64_t at = 0;
  for (auto s = window.end() - static_cast<std::ptrdiff_t>(n); s != window.end(); ++s)
    if (s->rank >= 0) at = std::max(at, s->ended_ns);
  return at;
}

void LinkDetector::evaluate(uint64_t now_ns) {
  for (auto it = comms_.begin(); it != comms_.end();) {
    auto comm = model_.comms.find(it->first);
    if (comm == model_.comms.end() || comm->second.ended) {  // its findings are resolved with it (Detector)
      it = comms_.erase(it);
      continue;
    }
    evaluate_comm(comm->second, it->second, now_ns);
    ++it;
  }
}

void LinkDetector::evaluate_comm(const CommState& comm, const CommLinks& links, uint64_t now_ns) {
  const auto& window = links.window;
  std::map<std::pair<int32_t, int32_t>, size_t> beyond;  // (sender, receiver) -> collectives
  uint64_t kernel_ns = 0;
  for (const Sample& s : window) {
    if (s.rank >= 0) ++beyond[{s.rank, s.peer}];
    kernel_ns += s.kernel_ns;
  }
  auto worst =
      std::max_element(beyond.begin(), beyond.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const double total = static_cast<double>(window.size());
  const bool judged = window.size() >= options_.min_collectives;
  // Open findings of this communicator's links that no longer hold.
  for (const Finding* f : book_.open()) {
    if (f->kind != FindingKind::slow_link || f->comm != comm.hash || f->ranks.size() < 2) continue;
    auto count = beyond.find({f->ranks[0], f->ranks[1]});
    if (judged && (count == beyond.end() || static_cast<double>(count->second) < options_.close_share * total))
      book_.resolve(f->key(), now_ns);
  }
  if (!judged || worst == beyond.end()) return;
  const auto [link, count] = *worst;
  Finding f;
  f.kind = FindingKind::slow_link;
  f.job = comm.job;
  f.comm = comm.hash;
  f.ranks = {link.first, link.second};
  const bool open = book_.open_finding(f.key()) != nullptr;
  if (static_cast<double>(count) < (open ? options_.close_share : options_.open_share) * total) return;
  std::vector<uint64_t> waits, others;
  uint64_t excess = 0;
  for (const Sample& s : window) {
    if (s.rank != link.first || s.peer != link.second) continue;
    waits.push_back(s.wait_ns);
    others.push_back(s.others_ns);
    excess += s.wait_ns - s.others_ns;
  }
  auto median = [](std::vector<uint64_t>& v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const uint64_t wait = median(waits), usual = median(others);
  auto where = [&](int32_t r) {
    auto m = comm.members.find(r);
    std::string node = m == comm.members.end() ? "" : m->second.node;
    f.nodes.push_back(node);
    return "rank " + std::to_string(r) + (node.empty() ? "" : " on " + node);
  };
  const std::string from = where(link.first), to = where(link.second);
  f.lateness_s = static_cast<double>(wait - usual) / 1e9;
  f.wait_share = kernel_ns ? static_cast<double>(excess) / static_cast<double>(kernel_ns) : 0;
  const std::string times =
      usual ? format_fixed(static_cast<double>(wait) / static_cast<double>(usual), 1) + "x" : "far beyond";
  f.summary = "slow link in job " + (comm.job.empty() ? "?" : comm.job) + ", comm " + hex64(comm.hash).substr(0, 8) +
              ": " + from + " -> " + to + ": its transfers waited " + format_duration_ns(static_cast<int64_t>(wait)) +
              " per collective on the network against " + format_duration_ns(static_cast<int64_t>(usual)) +
              " on the other links (" + times + "), at " + std::to_string(count) + " of the last " +
              std::to_string(window.size()) + " collectives sampled (link side: NCCL's proxy steps)";
  f.detail =
      f.summary + "\n" + "The link added " + format_percent(f.wait_share) +
      " to the collectives' GPU time where NCCL's proxy steps were sampled. Its sender's other work and "
      "its GPU are not the cause: the time is counted from when NCCL handed each step's data to the "
      "network until the network was done with it. Look at the NICs, cables and switch ports between " +
      (f.nodes[0].empty() ? "the two ranks" : f.nodes[0] + " and " + (f.nodes[1].empty() ? "its peer" : f.nodes[1])) +
      " (link errors, a port trained to a lower speed, congestion).";
  book_.raise(std::move(f), now_ns);
}

}  // namespace rankscope::collector
