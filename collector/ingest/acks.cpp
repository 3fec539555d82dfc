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
  if (window.last_used == 0) window.last_used = ++uses_;  // an earlier instance, replayed
  uncommitted_.push_back(Uncommitted{node.name, instance, seq});
  evict(node, kInstances + 1);
}

void AckBook::evict(NodeState& node, size_t keep) {
  while (node.acked.size() > keep) {
    auto oldest = std::min_element(node.acked.begin(), node.acked.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    if (oldest->first == node.instance) break;
    node.acked.erase(oldest);
  }
}

}  // namespace rankscope::collector
