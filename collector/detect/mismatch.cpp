// The mismatch detector: ranks that called different collectives at one
// sequence number (the matcher's mismatch event).
#include <algorithm>

#include "collector/detect/detector.h"
#include "collector/detect/text.h"

namespace rankscope::collector {

void Detector::on_mismatch(const CollectiveMismatch& mismatch) {
  // The culprits are the ranks outside the largest group of ranks that
  // made the same call (every rank when the largest is tied).
  const CommState& comm = mismatch.comm;
  size_t largest = 0, tied = 0;
  for (const auto& [call, ranks] : mismatch.groups) largest = std::max(largest, ranks.size());
  for (const auto& [call, ranks] : mismatch.groups) tied += ranks.size() == largest ? 1 : 0;
  Finding f;
  f.kind = FindingKind::mismatch;
  f.job = comm.job;
  f.comm = comm.hash;
  f.seq = static_cast<int64_t>(mismatch.seq);
  std::string calls;
  for (const auto& [call, ranks] : mismatch.groups) {
    if (tied > 1 || ranks.size() < largest) f.ranks.insert(f.ranks.end(), ranks.begin(), ranks.end());
    calls += (calls.empty() ? "" : "; ") + std::string(ranks.size() > 1 ? "ranks " : "rank ") + join(ranks) +
             " called " + call.describe();
  }
  std::sort(f.ranks.begin(), f.ranks.end());
  if (const Finding* open = book_.open_finding(f.key()); open && open->ranks == f.ranks) return;
  uint64_t now = clock_.realtime_ns();
  for (int32_t r : f.ranks) {
    auto m = comm.members.find(r);
    if (m != comm.members.end() && std::find(f.nodes.begin(), f.nodes.end(), m->second.node) == f.nodes.end())
      f.nodes.push_back(m->second.node);
  }
  f.summary = where("mismatch", comm) + " at collective #" + std::to_string(mismatch.seq) + ": " + calls;
  f.detail = f.summary +
             ".\nNCCL requires every rank to issue the same collectives in the same order; this job "
             "will hang or corrupt data at this point. Culprit rank(s): " +
             join(f.ranks) + ".";
  for (int32_t r : f.ranks) f.detail += "\n  " + describe_rank(comm, r, now);
  book_.raise(std::move(f), now);
}

}  // namespace rankscope::collector
