#pragma once
// One owner of each commit. Every writer of the collector's database (the
// ingest's records and cluster model, the findings, the usage ledger) takes
// part in the same protocol: it stages what changed since its last commit
// into the one WriteSet, the store makes the set durable, and only then is
// anything acknowledged to an agent or counted as committed.
//
// A commit that fails (an I/O error, a full disk) keeps the whole set: it is
// written again, with whatever came since, by the next commit, and the
// batches in it stay acknowledged-pending (a re-send waits for that commit,
// it is not applied again). So nothing staged is lost and nothing is counted
// twice. While commits fail, the set grows; past `max_backlog_bytes` the
// ingest takes no new batches (agents keep them in their spools and
// re-send) until a commit succeeds.
#include <cstdint>
#include <string>
#include <vector>

#include "collector/store/write_set.h"
#include "common/result.h"

namespace rankscope::collector {

class CommitParticipant {
 public:
  virtual ~CommitParticipant() = default;
  // Puts what changed since the last stage into `writes` (`now_ns` on the
  // cluster clock; `final`: the collector is stopping, write everything).
  // A participant that reads back rows it wrote must see them whether or
  // not they are durable yet (keep them until committed()).
  virtual Result<void> stage(WriteSet& writes, uint64_t now_ns, bool final) = 0;
  // What was staged so far is durable.
  virtual void committed() {}
};

// Where a commit goes: the store (StoreTarget, store/timeline_store.h), or a
// test's store whose disk fails.
class CommitTarget {
 public:
  virtual ~CommitTarget() = default;
  virtual WriteSet writes() const = 0;
  virtual Result<void> commit(WriteSet& writes) = 0;
};

class Commit {
 public:
  static constexpr uint64_t kMaxBacklogBytes = 256ull << 20;
  explicit Commit(CommitTarget& target, uint64_t max_backlog_bytes = kMaxBacklogBytes)
      : target_(target), writes_(target.writes()), max_backlog_bytes_(max_backlog_bytes) {}
  Commit(const Commit&) = delete;
  Commit& operator=(const Commit&) = delete;

  // Participants stage in the order they joined.
  void join(CommitParticipant& participant) { participants_.push_back(&participant); }
  // Where records go as they are applied (the ingest's hot path).
  WriteSet& writes() { return writes_; }

  // Stages every participant, then writes. On success every participant
  // is told; on failure the set is kept for the next run (and the error
  // logged, at most every 10 s).
  Result<void> run(uint64_t now_ns, bool final = false);

  // The last run failed.
  bool failing() const { return failing_; }
  // Commits failed and what waits to be written is over the bound: take no new batches.
  bool holding() const { return failing_ && writes_.bytes() > max_backlog_bytes_; }
  uint64_t failures() const { return failures_; }
  uint64_t backlog_bytes() const { return writes_.bytes(); }

 private:
  CommitTarget& target_;
  WriteSet writes_;
  uint64_t max_backlog_bytes_;
  std::vector<CommitParticipant*> participants_;
  bool failing_ = false;
  uint64_t failures_ = 0;
  // Errors logged at most every 10 s (a failing disk fails every round).
  void log_error(const std::string& what, uint64_t now_ns);
  uint64_t logged_ns_ = 0, suppressed_ = 0;
};

}  // namespace rankscope::collector
