// The one commit protocol (collector/commit.h) when the database cannot be
// written: every writer (ingest, findings, usage ledger) keeps what it
// staged, nothing is acknowledged until it is durable, a batch the agent
// re-sends meanwhile is not applied or counted again, and a full backlog
// stops intake instead of growing without bound.
#include "collector/commit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "collector/service.h"
#include "collector/usage/report.h"
#include "proto/records.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"
#include "tests/support/wire.h"

namespace rankscope::collector {
namespace {

namespace wire = proto::wire;
constexpr uint64_t kS = 1'000'000'000ull;
constexpr uint64_t kDay0 = 1'780'000'000ull - 1'780'000'000ull % 86'400;
constexpr uint64_t kComm = 0x5eed5eed5eed5eedull;

// The real store behind a disk that can be full: a commit then fails and
// writes nothing, as RocksDB does when its log cannot be written.
class FullableDisk final : public CommitTarget {
 public:
  explicit FullableDisk(TimelineStore& store) : store_(store) {}
  WriteSet writes() const override { return store_.writes(); }
  Result<void> commit(WriteSet& writes) override {
    std::lock_guard hold(gate);  // a test holds it to keep a pipelined write in flight
    if (full) {
      ++refused;
      return Error{Errc::storage, "writing to RocksDB: IO error: No space left on device (test disk)"};
    }
    return store_.commit(writes);
  }
  std::atomic<bool> full = false;
  std::atomic<int> refused = 0;
  std::mutex gate;

 private:
  TimelineStore& store_;
};

class CommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = TimelineStore::open(dir.file("db"));
    ASSERT_TRUE(opened) << opened.error().message;
    store = std::move(*opened);
    disk = std::make_unique<FullableDisk>(*store);
  }
  // The collector's writers on one commit, as collector::run has them (its Service).
  void start(uint64_t max_backlog_bytes = Commit::kMaxBacklogBytes) {
    ServiceOptions options;
    options.max_commit_backlog_bytes = max_backlog_bytes;
    service = std::make_unique<Service>(*store, *disk, clock, options);
    commit = &service->commit();
    ingest = &service->ingest();
    ledger = &service->ledger();
    findings = &service->findings();
  }
  Outbox say(int rank, const std::string& bytes) {
    Outbox out;
    ingest->on_agent_message("conn-" + std::to_string(rank), bytes, out);
    return out;
  }
  // node-<rank>'s agent: hello, then its process (job-1, an account per
  // rank) and its membership of the 2-rank communicator in batch 1.
  void join(int rank) {
    std::string node = "node-" + std::to_string(rank);
    say(rank, testing::hello_message(node, 7));
    testing::AgentBatch b;
    b.instance = 7;
    b.processes = {testing::process(100 + rank, "job-1", rank == 0 ? "physics" : "chem")};
    b.comms = {testing::member(100 + rank, kComm, rank, 2)};
    b.clock_samples = {testing::tight_clock_sample()};
    say(rank, b.bytes());
  }
  // Batch `seq` of node-<rank>: 10 AllReduce calls from t0, rank 1 50 ms late at each.
  Outbox calls(int rank, uint64_t seq, uint64_t t0) {
    proto::ColumnBlock block;
    block.pid = 100 + static_cast<uint32_t>(rank);
    block.comm_hash = kComm;
    block.rank = rank;
    for (uint64_t i = 0; i < 10; ++i)
      block.records.push_back(
          testing::allreduce_call((seq - 2) * 10 + i, t0 + i * kS + (rank == 1 ? 50'000'000ull : 0)));
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = seq;
    b.calls = {block};
    return say(rank, b.bytes());
  }
  const ReportLine* line(const Report& r, const std::string& tenant) {
    for (const auto& l : r.rows)
      if (l.tenant == tenant) return &l;
    return nullptr;
  }

  testing::TempDir dir;
  testing::ManualClock clock{kDay0 * kS};
  std::unique_ptr<TimelineStore> store;
  std::unique_ptr<FullableDisk> disk;
  std::unique_ptr<Service> service;
  Commit* commit = nullptr;
  Ingest* ingest = nullptr;
  UsageLedger* ledger = nullptr;
  FindingBook* findings = nullptr;
};

TEST_F(CommitTest, AFailedCommitLosesNothingAndAReSentBatchIsCountedOnce) {
  start();
  join(0);
  join(1);
  ASSERT_TRUE(commit->run(clock.now));

  // The disk fills. Both agents send their calls; a finding opens; the
  // ledger's flush comes due: all of it is staged into a commit that fails.
  disk->full = true;
  uint64_t t0 = kDay0 * kS + 120 * kS;
  Outbox first0 = calls(0, 2, t0), first1 = calls(1, 2, t0);
  EXPECT_EQ(first0.after_commit.size() + first1.after_commit.size(), 2u) << "acks wait for the commit";
  Finding straggler;
  straggler.kind = FindingKind::straggler;
  straggler.job = "job-1";
  straggler.comm = kComm;
  straggler.ranks = {1};
  straggler.summary = "rank 1 is late";
  uint64_t id = findings->raise(straggler, t0 + 10 * kS).id;
  clock.now = t0 + 20 * kS;
  ledger->tick(clock.now, findings->open());
  auto failed = commit->run(clock.now);
  ASSERT_FALSE(failed) << "the disk is full";
  EXPECT_NE(failed.error().message.find("No space left"), std::string::npos) << failed.error().message;
  EXPECT_TRUE(commit->failing());
  EXPECT_EQ(*store->count(kComm, 0, 0), 0u) << "nothing reached the database";

  // No ack reached the agents: they re-send. The batches are already
  // applied (and waiting to be written): not applied or counted again,
  // acknowledged by the commit that writes them.
  Outbox again0 = calls(0, 2, t0), again1 = calls(1, 2, t0);
  EXPECT_EQ(ingest->counters().duplicate_batches, 2u);
  EXPECT_EQ(again0.after_commit.size() + again1.after_commit.size(), 2u) << "acked only once durable";
  EXPECT_TRUE(again0.now.empty() && again1.now.empty()) << "not acked before the commit";
  clock.now += 10 * kS;
  ledger->tick(clock.now, findings->open());
  EXPECT_FALSE(commit->run(clock.now)) << "still full";

  // Space again: the next commit writes everything that was staged.
  disk->full = false;
  clock.now += 10 * kS;
  ledger->tick(clock.now, findings->open());
  ASSERT_TRUE(commit->run(clock.now, true));
  EXPECT_FALSE(commit->failing());
  EXPECT_EQ(commit->failures(), 2u);
  EXPECT_EQ(*store->count(kComm, 0, 0), 10u);
  EXPECT_EQ(*store->count(kComm, 0, 1), 10u);
  EXPECT_EQ(ingest->counters().records_stored, 20u) << "the re-sent records were not counted again";
  EXPECT_EQ(ingest->comms().at(kComm).members.at(1).records, 10u);

  // The finding and the ledger's rows survive, each counted once.
  FindingBook reread;
  ASSERT_TRUE(FindingWriter(reread).restore(*store));
  ASSERT_NE(reread.open_finding(straggler.key()), nullptr) << "the finding staged in the failed commit is stored";
  EXPECT_EQ(reread.open_finding(straggler.key())->id, id);
  auto r = make_report(*store, kDay0, kDay0 + 3600, TenantKey::account, "");
  ASSERT_TRUE(r) << r.error().message;
  const ReportLine* physics = line(*r, "physics");
  const ReportLine* chem = line(*r, "chem");
  ASSERT_NE(physics, nullptr);
  ASSERT_NE(chem, nullptr);
  EXPECT_DOUBLE_EQ(physics->usage.collectives, 10) << "each call counted once, not once per delivery";
  EXPECT_DOUBLE_EQ(chem->usage.collectives, 10);
  EXPECT_NEAR(physics->waste_s, 0.5, 1e-6) << "10 waits of 50 ms, once";
  EXPECT_NEAR(chem->caused_s, 0.5, 1e-6);

  // A restarted collector reads the same counts back.
  Commit after(*disk);
  Ingest restarted(*store, after, clock);
  ASSERT_TRUE(restarted.restore());
  EXPECT_EQ(restarted.comms().at(kComm).members.at(0).records, 10u);
  EXPECT_EQ(restarted.node("node-1")->records, 10u);
}

TEST_F(CommitTest, RollupsAddUpAcrossAFailedCommit) {
  // The hour and day rows add each flush's change to what the last flush
  // wrote: after a failed commit that is in memory, not in the database.
  start();
  join(0);
  join(1);
  ASSERT_TRUE(commit->run(clock.now));
  uint64_t t0 = kDay0 * kS + 120 * kS;
  calls(0, 2, t0);
  calls(1, 2, t0);
  clock.now = t0 + 20 * kS;
  ledger->tick(clock.now, findings->open());
  disk->full = true;
  ASSERT_FALSE(commit->run(clock.now, true));
  disk->full = false;
  calls(0, 3, t0 + 60 * kS);
  calls(1, 3, t0 + 60 * kS);
  clock.now = t0 + 80 * kS;
  ledger->tick(clock.now, findings->open());
  ASSERT_TRUE(commit->run(clock.now, true));
  // The hour's row (read when the range is whole hours) holds both flushes.
  auto r = make_report(*store, kDay0, kDay0 + 3600, TenantKey::account, "");
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_NE(line(*r, "physics"), nullptr);
  EXPECT_DOUBLE_EQ(line(*r, "physics")->usage.collectives, 20);
}

TEST_F(CommitTest, AFullBacklogStopsIntakeUntilTheDiskIsBack) {
  start(/*max_backlog_bytes=*/1);
  join(0);
  join(1);
  ASSERT_TRUE(commit->run(clock.now));
  uint64_t t0 = kDay0 * kS + 120 * kS;
  disk->full = true;
  calls(0, 2, t0);
  ASSERT_FALSE(commit->run(clock.now));
  EXPECT_TRUE(commit->holding());

  // Over the backlog: not taken, not acknowledged, not counted.
  Outbox held = calls(0, 3, t0 + 60 * kS);
  EXPECT_TRUE(held.after_commit.empty() && held.now.empty()) << "no ack: the agent keeps it and re-sends";
  EXPECT_EQ(ingest->counters().held_batches, 1u);
  EXPECT_EQ(ingest->counters().batches_stored, 3u) << "two batches of 1 and one of calls";

  disk->full = false;
  ASSERT_TRUE(commit->run(clock.now));
  EXPECT_FALSE(commit->holding());
  Outbox taken = calls(0, 3, t0 + 60 * kS);  // the agent's re-send
  EXPECT_EQ(taken.after_commit.size(), 1u);
  ASSERT_TRUE(commit->run(clock.now));
  EXPECT_EQ(*store->count(kComm, 0, 0), 20u);
  EXPECT_EQ(ingest->counters().duplicate_batches, 0u) << "the held batch was never applied";
}

// The collector's loop writes on a thread of its own (Commit::begin, finish)
// while it takes in the next batches. A batch applied while a write is in
// flight is not in that write: its completion acknowledges only what it held.
TEST_F(CommitTest, APipelinedWriteAcknowledgesOnlyTheBatchesItHeld) {
  start();
  join(0);
  join(1);
  ASSERT_TRUE(commit->run(clock.now));
  uint64_t t0 = kDay0 * kS + 120 * kS;
  Outbox first = calls(0, 2, t0);
  ASSERT_EQ(first.after_commit.size(), 1u);

  std::unique_lock hold(disk->gate);  // the write stays in flight until released
  ASSERT_TRUE(commit->begin(clock.now));
  EXPECT_TRUE(commit->writing());
  Outbox during = calls(0, 3, t0 + 10 * kS);
  EXPECT_EQ(during.after_commit.size(), 1u) << "applied, not yet acknowledged";
  Outbox resent = calls(0, 2, t0);
  EXPECT_TRUE(resent.now.empty()) << "batch 2 is being written: acknowledged once durable";
  EXPECT_FALSE(commit->write_done());
  hold.unlock();
  ASSERT_TRUE(commit->finish());
  EXPECT_FALSE(commit->writing());
  EXPECT_EQ(*store->count(kComm, 0, 0), 10u) << "the write held batch 2 alone";

  // Batch 2 is durable now; batch 3 came during the write and waits for the next.
  EXPECT_EQ(calls(0, 2, t0).now.size(), 1u) << "batch 2 is acknowledged at once";
  Outbox batch3 = calls(0, 3, t0 + 10 * kS);
  EXPECT_TRUE(batch3.now.empty()) << "batch 3 is not durable: its ack waits for the write that holds it";
  EXPECT_EQ(batch3.after_commit.size(), 1u);
  ASSERT_TRUE(commit->begin(clock.now));
  ASSERT_TRUE(commit->finish());
  EXPECT_EQ(*store->count(kComm, 0, 0), 20u);
  EXPECT_EQ(calls(0, 3, t0 + 10 * kS).now.size(), 1u);
  EXPECT_EQ(ingest->counters().records_stored, 20u) << "re-sent batches were not applied again";
}

// A pipelined write that fails puts its set back under what came since: the
// next write holds both, and nothing is acknowledged before it.
TEST_F(CommitTest, AFailedPipelinedWriteIsWrittenByTheNextWithWhatCameSince) {
  start();
  join(0);
  join(1);
  ASSERT_TRUE(commit->run(clock.now));
  uint64_t t0 = kDay0 * kS + 120 * kS;
  disk->full = true;
  calls(0, 2, t0);
  calls(1, 2, t0);
  ASSERT_TRUE(commit->begin(clock.now));
  calls(0, 3, t0 + 10 * kS);  // taken in while the write runs (and fails)
  auto failed = commit->finish();
  ASSERT_FALSE(failed);
  EXPECT_TRUE(commit->failing());
  EXPECT_GT(commit->backlog_bytes(), 0u);
  EXPECT_EQ(*store->count(kComm, 0, 0), 0u);
  EXPECT_TRUE(calls(0, 2, t0).now.empty()) << "not durable: not acknowledged";

  disk->full = false;
  calls(1, 3, t0 + 10 * kS);
  ASSERT_TRUE(commit->begin(clock.now));
  ASSERT_TRUE(commit->finish());
  EXPECT_FALSE(commit->failing());
  EXPECT_EQ(commit->backlog_bytes(), 0u);
  EXPECT_EQ(*store->count(kComm, 0, 0), 20u);
  EXPECT_EQ(*store->count(kComm, 0, 1), 20u);
  for (int rank : {0, 1})
    for (uint64_t seq : {2, 3}) EXPECT_EQ(calls(rank, seq, t0 + (seq - 2) * 10 * kS).now.size(), 1u) << rank << seq;
  EXPECT_EQ(ingest->counters().records_stored, 40u);
  EXPECT_EQ(ingest->comms().at(kComm).members.at(0).records, 20u);
}

}  // namespace
}  // namespace rankscope::collector
