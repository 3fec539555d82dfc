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
//
// Pipelined (the collector's loop, start_writer()): the store's write of one
// round runs on a thread of its own, on the other core, while the next
// round's batches are taken in and applied. Participants are staged only
// between writes, so "what was staged so far" is what the finished write
// held when they are told it is durable; what they did since (a batch
// applied meanwhile) waits for the next write.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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
      : target_(target), writes_(target.writes()), in_flight_(target.writes()), max_backlog_bytes_(max_backlog_bytes) {}
  ~Commit();
  Commit(const Commit&) = delete;
  Commit& operator=(const Commit&) = delete;

  // Participants stage in the order they joined.
  void join(CommitParticipant& participant) { participants_.push_back(&participant); }
  // Where records go as they are applied (the ingest's hot path).
  WriteSet& writes() { return writes_; }

  // Stages every participant, then writes, and returns once written (a
  // write in flight is finished first). On success every participant is
  // told; on failure the set is kept for the next run (and the error
  // logged, at most every 10 s).
  Result<void> run(uint64_t now_ns, bool final = false);

  // The pipelined commit. start_writer() starts the writer thread, once.
  void start_writer();
  // Stages every participant and hands the set to the writer thread; not
  // while a write is in flight. Returns false when there was nothing to
  // write: every participant is told at once, as after a write.
  bool begin(uint64_t now_ns);
  bool writing() const { return writing_; }
  // The write in flight has finished (finish() will not wait). done_fd()
  // is readable meanwhile (an eventfd, for the loop's poll); finish()
  // drains it.
  bool write_done() const;
  int done_fd() const { return done_fd_; }
  // Waits for the write in flight and applies its outcome: on success every
  // participant is told; on failure its set goes back under what was put
  // since, written by the next commit.
  Result<void> finish();

  // The last write failed.
  bool failing() const { return failing_; }
  // Commits fail, or a write is slow, and what waits to be written is over
  // the bound: take no new batches.
  bool holding() const { return (failing_ || writing_) && backlog_bytes() > max_backlog_bytes_; }
  uint64_t failures() const { return failures_; }
  uint64_t backlog_bytes() const { return writes_.bytes() + (writing_ ? in_flight_bytes_ : 0); }

 private:
  void stage_all(uint64_t now_ns, bool final);
  void succeeded();
  void failed(const Error& error, uint64_t now_ns);
  void writer_loop();

  CommitTarget& target_;
  WriteSet writes_;
  WriteSet in_flight_;  // the writer thread's while writing_
  uint64_t max_backlog_bytes_;
  std::vector<CommitParticipant*> participants_;
  bool failing_ = false;
  uint64_t failures_ = 0;
  // The writer thread: takes in_flight_ when `job_` is set, leaves its outcome in `result_`.
  std::thread writer_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the writer: a job, or quit
  std::condition_variable done_;  // finish(): the job's outcome
  bool job_ = false, quit_ = false;
  std::optional<Result<void>> result_;
  bool writing_ = false;
  uint64_t in_flight_bytes_ = 0, in_flight_now_ns_ = 0;
  int done_fd_ = -1;
  // Errors logged at most every 10 s (a failing disk fails every round).
  void log_error(const std::string& what, uint64_t now_ns);
  uint64_t logged_ns_ = 0, suppressed_ = 0;
};

}  // namespace rankscope::collector
