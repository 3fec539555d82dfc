#include "collector/ingest/acks.h"

#include <algorithm>

namespace rankscope::collector {

AckBook::Seen AckBook::seen(const NodeState& node, uint64_t instance, uint64_t seq) const {
  auto window = node.acked.find(instance);
  if (window == node.acked.end() || !window->second.contains(seq)) return Seen::new_batch;
  auto same = [&](const Uncommitted& u) { return u.seq == seq && u.instance == instance && u.node == node.name; };
  bool pending =
      std::any_of(uncommitted_.begin(), uncommitted_.end(), same) || std::any_of(staged_.begin(), staged_.end(), same);
  return pending ? Seen::pending : Seen::stored;
}

void AckBook::new_instance(NodeState& node) {
  // The earlier instances' windows stay: a restarted agent replays their spooled batches.
  node.acked[node.instance].last_used = ++uses_;
  evict(node, kInstances);
}

void AckBook::mark_stored(NodeState& node, uint64_t instance, uint64_t seq) {
  AckWindow& window = node.acked[instance];
  window.insert(seq);
  window.last_used = ++uses_;  // an earlier instance replayed, or a stream of a fleet's agent
  uncommitted_.push_back(Uncommitted{node.name, instance, seq});
  evict(node, kInstances + 1);
}

void AckBook::evict(NodeState& node, size_t keep) {
  while (node.acked.size() > keep) {
    // The least recently used, never the current instance's (which, in a
    // fleet, numbers no batch: each job's stream has an instance id of its own).
    auto oldest = node.acked.end();
    for (auto it = node.acked.begin(); it != node.acked.end(); ++it)
      if (it->first != node.instance && (oldest == node.acked.end() || it->second.last_used < oldest->second.last_used))
        oldest = it;
    if (oldest == node.acked.end()) break;
    node.acked.erase(oldest);
  }
}

}  // namespace rankscope::collector
