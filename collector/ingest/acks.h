#pragma once
// Which batches are stored, and when each may be acknowledged.
//
// Each node keeps the batch numbers stored per agent instance (AckWindow,
// in the model, persisted with the node): a batch sent again is recognised
// and acknowledged again, not applied twice. The newest kInstances
// instances are remembered (a restarted agent replays its earlier
// instances' spooled batches). A batch applied in this commit round is
// "uncommitted" until the commit that holds it is durable: a re-send of it
// meanwhile is acknowledged after that commit, not before (collector/commit.h).
// A batch applied while an earlier commit is being written is not in it:
// only staging() puts the batches applied so far into the commit staged.
#include <cstdint>
#include <string>
#include <vector>

#include "collector/model/cluster.h"

namespace rankscope::collector {

class AckBook {
 public:
  // Agent instances per node whose stored batches are remembered: a node's
  // agent runs, and in a fleet its streams (one per job on the node, each
  // numbered by an instance id of its own: node-agent/transport.h).
  static constexpr size_t kInstances = 32;

  enum class Seen {
    new_batch,  // not stored: apply it
    stored,     // stored and durable: acknowledge it now
    pending,    // stored in this round: acknowledge it after the commit
  };
  Seen seen(const NodeState& node, uint64_t instance, uint64_t seq) const;

  // A Hello from a new agent instance of `node` (node.instance set already).
  void new_instance(NodeState& node);
  // A window read back from the database (oldest first).
  void restored(AckWindow& window) { window.last_used = ++uses_; }
  // Batch `seq` of `instance` applied: stored once the round's commit is durable.
  void mark_stored(NodeState& node, uint64_t instance, uint64_t seq);
  // The batches applied so far go into the commit being staged.
  void staging() {
    staged_.insert(staged_.end(), uncommitted_.begin(), uncommitted_.end());
    uncommitted_.clear();
  }
  // The commit staged last is durable (batches applied since wait for the next).
  void committed() { staged_.clear(); }

 private:
  // Forgets the least recently used windows past `keep` (never the current instance's).
  static void evict(NodeState& node, size_t keep);

  struct Uncommitted {
    std::string node;
    uint64_t instance, seq;
  };
  std::vector<Uncommitted> uncommitted_;  // applied, not yet staged
  std::vector<Uncommitted> staged_;       // in a commit not yet durable (kept while commits fail)
  uint64_t uses_ = 0;
};

}  // namespace rankscope::collector
