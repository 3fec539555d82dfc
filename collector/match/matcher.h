#pragma once
// The one collective matcher: every record of every rank, matched across
// ranks, once, for every consumer (the detectors, the usage ledger).
//
// A collective instance is (communicator, sequence number) on lane 0; it is
// open from the first rank's record until every member has issued it. Then
// it is complete, and the listeners hear every member's arrival on the
// cluster clock; or ranks issued different calls at it (op, type, count,
// root), and they hear a mismatch (again whenever another rank arrives).
// Point-to-point calls pair up per direction: the k-th Send from s to d with
// the k-th Recv on d from s (lane 1 + 2 x peer + 1 for a Recv).
//
// Open instances cost a slot per rank whoever sent them, so they are charged
// to an OpenBudget (open_budget.h): a user who inflates their own
// communicator loses their own matching, never another job's.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collector/match/open_budget.h"
#include "collector/model/cluster.h"

namespace rankscope::collector {

// What a rank called at a sequence number.
struct CallShape {
  uint32_t code = 0;   // op | datatype << 8 | redop << 16
  uint64_t count = 0;
  int32_t root = -1;   // -1 for collectives without one
  static CallShape of(const proto::CallRecord& record);
  uint8_t op() const { return static_cast<uint8_t>(code); }
  uint64_t signature() const {
    return (static_cast<uint64_t>(code) << 32) ^ (count * 0x9e3779b97f4a7c15ull) ^ static_cast<uint32_t>(root);
  }
  // "AllReduce 1024 x float32 sum", "Broadcast 16 x int8 root 0".
  std::string describe() const;
};

// An instance some ranks issued and not all (yet).
struct OpenCollective {
  CallShape first;                   // the first arrival's call
  uint64_t first_signature = 0;
  uint64_t first_issue_ns = 0;       // the earliest arrival, cluster clock
  std::vector<uint64_t> issue;       // by rank, cluster clock; 0: not yet
  std::vector<uint64_t> signature;   // by rank: what it called
  std::map<uint64_t, CallShape> distinct;  // the different calls made, by signature
  int32_t arrived = 0;
  bool mismatched = false;
};

// Every member issued it, with the same call.
struct CollectiveComplete {
  const CommState& comm;
  uint64_t seq;
  const std::vector<uint64_t>& issue;  // by rank, cluster clock
};

// Ranks issued different calls at one sequence number.
struct CollectiveMismatch {
  const CommState& comm;
  uint64_t seq;
  std::vector<std::pair<CallShape, std::vector<int32_t>>> groups;  // each call and the ranks that made it
};

// A Send and the Recv it pairs with, both posted.
struct PairComplete {
  const CommState& comm;
  int32_t sender, receiver;
  uint64_t send_issue_ns, recv_issue_ns;  // cluster clock
};

class MatchListener {
 public:
  virtual ~MatchListener() = default;
  virtual void on_complete(const CollectiveComplete& done) {}
  virtual void on_mismatch(const CollectiveMismatch& mismatch) {}
  virtual void on_pair(const PairComplete& pair) {}
  // A call of an exchange (a collective or either half of a Send/Recv pair):
  // its sequence number on its lane, its issue time on the cluster clock.
  struct Issue {
    uint64_t seq = 0;
    uint64_t issue_ns = 0;
  };
  // A rank issued calls of exchanges on one lane of a communicator the
  // matcher matches, in the order sent: a block's, told before the block's
  // exchanges are matched.
  virtual void on_issues(const CommState& comm, int32_t rank, uint32_t lane, std::span<const Issue> issues) {}
};

class CollectiveMatcher final : public RecordObserver {
 public:
  static constexpr size_t kMaxPendingPairs = 65536;  // Send/Recv halves waiting for their other half, per communicator

  // Records come from on_record: the ingest's first observer (collector/service.h).
  CollectiveMatcher() = default;
  // Listeners hear events in the order they subscribed.
  void subscribe(MatchListener& listener) { listeners_.push_back(&listener); }

  void on_records(const CommState& comm, int32_t rank, uint32_t lane,
                  std::span<const proto::CallRecord> records) override;
  // Drops what is open of communicators that ended (every member ended
  // them: what is open never completes) or that `comms` (the model's) lacks.
  void sweep(const std::map<uint64_t, CommState>& comms);

  // Whether instance `seq` of `comm` is open and its ranks called different things.
  bool mismatched(uint64_t comm, uint64_t seq) const;
  // The first open instance of `comm` at or after `seq`: (its seq, it), or (0, null).
  std::pair<uint64_t, const OpenCollective*> open_from(uint64_t comm, uint64_t seq) const;
  // The ranks that `rank`'s call at (lane, seq) of `comm` still waits for:
  // on lane 0, the members that have not issued the open instance; for a
  // Send or Recv, its peer while the other half is not posted. Empty when
  // the exchange completed (or was never seen, or dropped by a bound), and
  // for a mismatched instance (its own finding tells it).
  std::vector<int32_t> awaited(uint64_t comm, int32_t rank, uint32_t lane, uint64_t seq) const;
  // A Send or Recv posted, its other half not (yet): `waiting` posted the
  // k-th call of the pair's direction, `missing` has not posted its match.
  struct PendingPair {
    int32_t waiting = -1, missing = -1;
    uint64_t k = 0;
    uint64_t since_ns = 0;  // when `waiting` posted it, cluster clock
    bool waiting_receives = false;
  };
  // The pending halves of `comm` posted at or before `before_ns`.
  std::vector<PendingPair> pending_pairs(uint64_t comm, uint64_t before_ns) const;
  // Memory held by open instances, and how many the bound dropped.
  uint64_t open_bytes() const { return budget_.bytes(); }
  uint64_t open_evicted() const { return budget_.evicted(); }

 private:
  struct PendingHalf {
    uint64_t issue_ns = 0;
    bool recv = false;
  };
  struct CommMatch {
    std::map<uint64_t, OpenCollective> open;  // by seq
    std::map<std::tuple<int32_t, int32_t, uint64_t>, PendingHalf> p2p;  // (sender, receiver, k): one side seen
  };
  void on_collective(const CommState& comm, CommMatch& state, int32_t rank, const proto::CallRecord& record);
  void on_p2p(const CommState& comm, CommMatch& state, int32_t rank, uint32_t lane, const proto::CallRecord& record);
  void mismatch(const CommState& comm, uint64_t seq, OpenCollective& instance);

  std::vector<MatchListener*> listeners_;
  std::map<uint64_t, CommMatch> comms_;
  std::vector<MatchListener::Issue> issues_;  // a block's, reused
  // Open instances hold two words per rank (issue time, signature).
  OpenBudget budget_{2 * sizeof(uint64_t)};
};

}  // namespace rankscope::collector
