// The collector's ingest on a real RocksDB: hello first, durable acks,
// idempotent re-sends, refusals with a reason.
#include "collector/ingest/ingest.h"

#include <gtest/gtest.h>

#include <tuple>

#include "collector/ingest/acks.h"
#include "tests/support/harness.h"
#include "tests/support/manual_clock.h"
#include "tests/support/store_commit.h"
#include "tests/support/wire.h"

namespace rankscope::collector {
namespace {

using FixedClock = testing::ManualClock;

std::string hello(const std::string& node, uint32_t version = wire::PROTOCOL_VERSION, uint64_t instance = 99,
                  uint64_t realtime_offset_ns = 5'000'000, bool takes_detail = true) {
  capnp::MallocMessageBuilder message;
  auto h = message.initRoot<wire::AgentMessage>().initHello();
  h.setProtocolVersion(version);
  h.setNode(node);
  h.setInstanceId(instance);
  h.setMonotonicNs(1'000);
  h.setRealtimeNs(1'000 + realtime_offset_ns);
  h.setTakesDetail(takes_detail);
  return proto::to_packed(message);
}

std::string batch(uint64_t seq, uint64_t first_record_seq, size_t records, uint64_t instance = 99,
                  bool compact = false) {
  testing::AgentBatch b;
  b.compact = compact;
  b.instance = instance;
  b.seq = seq;
  b.processes = {testing::process(10, "job-7")};
  b.comms = {testing::member(10, 0xc0ffee, 1, 2)};
  b.comms[0].origin = wire::CommOrigin::INIT_RANK;
  proto::ColumnBlock block;
  block.pid = 10;
  block.comm_hash = 0xc0ffee;
  block.rank = 1;
  for (size_t i = 0; i < records; ++i) {
    proto::CallRecord r;
    r.seq = first_record_seq + i;
    r.issue_ns = 2'000 + i * 100;
    r.return_ns = r.issue_ns + 10;
    r.count = 256;
    r.op = RS_OP_ALLREDUCE;
    r.datatype = 7;
    block.records.push_back(r);
  }
  b.calls = {block};
  return b.bytes();
}

wire::CollectorMessage::Which kind_of(const std::string& bytes) {
  wire::CollectorMessage::Which which{};
  EXPECT_TRUE(proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto m) { which = m.which(); }));
  return which;
}

class IngestTest : public ::testing::Test {
 protected:
  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  FixedClock clock;
  testing::StoreCommit commit{*store};
  Ingest ingest{*store, commit, clock};
};

TEST_F(IngestTest, BatchBeforeHelloIsAnsweredWithNeedHello) {
  Outbox out;
  ingest.on_agent_message("conn-1", batch(1, 0, 3), out);
  ASSERT_EQ(out.now.size(), 1u);
  EXPECT_EQ(kind_of(out.now[0].second), wire::CollectorMessage::ERROR);
  EXPECT_TRUE(out.after_commit.empty());
}

TEST_F(IngestTest, AckComesOnlyAfterCommitAndReSendsChangeNothing) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", batch(1, 0, 5), out);
  ASSERT_EQ(out.after_commit.size(), 1u);
  EXPECT_EQ(kind_of(out.after_commit[0].second), wire::CollectorMessage::ACK);
  ASSERT_TRUE(commit.run(0));
  EXPECT_EQ(*store->count(0xc0ffee, 0, 1), 5u);

  Outbox again;
  ingest.on_agent_message("conn-1", batch(1, 0, 5), again);  // our ack was lost; the agent re-sends
  ASSERT_EQ(again.now.size(), 1u);
  EXPECT_EQ(kind_of(again.now[0].second), wire::CollectorMessage::ACK);
  EXPECT_TRUE(again.after_commit.empty());
  ASSERT_TRUE(commit.run(0));
  EXPECT_EQ(*store->count(0xc0ffee, 0, 1), 5u);
  EXPECT_EQ(ingest.counters().records_stored, 5u);
  EXPECT_EQ(ingest.counters().duplicate_batches, 1u);

  const CommState& comm = ingest.comms().at(0xc0ffee);
  EXPECT_EQ(comm.job, "job-7");
  EXPECT_EQ(comm.nranks, 2);
  EXPECT_EQ(comm.members.at(1).node, "gpu-1");
  EXPECT_EQ(comm.members.at(1).last_seq, 4);
}

std::string clock_probe(uint64_t t1) {
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::AgentMessage>().initClockProbe().setT1(t1);
  return proto::to_packed(message);
}

// What a clock reply says: (t1, t2, t3).
std::tuple<uint64_t, uint64_t, uint64_t> clock_reply_of(const std::string& bytes) {
  std::tuple<uint64_t, uint64_t, uint64_t> out{};
  EXPECT_TRUE(proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto m) {
    ASSERT_EQ(m.which(), wire::CollectorMessage::CLOCK_REPLY);
    out = {m.getClockReply().getT1(), m.getClockReply().getT2(), m.getClockReply().getT3()};
  }));
  return out;
}

// The collector answers a probe as it reads it, ahead of the batches read
// before it (collector.cpp, ReadAhead): only a probe, only on a connection
// that said hello, only under that connection's key; anything else goes
// through on_agent_message in its turn.
TEST_F(IngestTest, AClockProbeIsAnsweredAheadOnlyOnAConnectionThatSaidHello) {
  Outbox out;
  EXPECT_FALSE(ingest.answer_clock_probe("conn-1", clock_probe(7), out)) << "no hello yet: in its turn";
  EXPECT_TRUE(out.now.empty());
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  out.now.clear();

  clock.now += 123'456;
  ASSERT_TRUE(ingest.answer_clock_probe("conn-1", clock_probe(7), out));
  ASSERT_EQ(out.now.size(), 1u);
  EXPECT_EQ(out.now[0].first, "conn-1");
  auto [t1, t2, t3] = clock_reply_of(out.now[0].second);
  EXPECT_EQ(t1, 7u);
  EXPECT_EQ(t2, clock.now);
  EXPECT_EQ(t3, clock.now);
  EXPECT_EQ(ingest.node("gpu-1")->last_contact_ns, clock.now);
  EXPECT_TRUE(out.after_commit.empty());

  out.now.clear();
  EXPECT_FALSE(ingest.answer_clock_probe("conn-1", batch(1, 0, 3), out)) << "a batch: in its turn";
  EXPECT_FALSE(ingest.answer_clock_probe("conn-1", std::string("\x01\x02garbage"), out));
  EXPECT_FALSE(ingest.answer_clock_probe("conn-1", clock_probe(8), out, "gpu-2")) << "another node's key";
  EXPECT_TRUE(out.now.empty());
  EXPECT_TRUE(out.after_commit.empty());
  EXPECT_EQ(ingest.counters().bad_messages, 0u) << "nothing is judged here";

  // In its turn a probe is answered the same way.
  ingest.on_agent_message("conn-1", clock_probe(9), out);
  ASSERT_EQ(out.now.size(), 1u);
  EXPECT_EQ(std::get<0>(clock_reply_of(out.now[0].second)), 9u);
}

TEST_F(IngestTest, RecordsAreStoredOnTheCollectorClock) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);  // seeds offset realtime - monotonic = 5 ms
  ingest.on_agent_message("conn-1", batch(1, 0, 1), out);
  ASSERT_TRUE(commit.run(0));
  auto records = store->tail(0xc0ffee, 0, 1, 0);
  ASSERT_TRUE(records);
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].call.issue_ns, 2'000u + 5'000'000u);
}

// The GPU side of a member's collectives (NCCL's profiler plugin) reaches
// the observers on the cluster clock, once per batch (not again when the
// batch is re-sent), and only for a member the sending process holds.
TEST_F(IngestTest, GpuRecordsReachTheObserversOnTheClusterClockForTheirOwnMemberOnly) {
  struct Seen : RecordObserver {
    std::vector<std::tuple<int32_t, uint8_t, proto::GpuRecord>> gpu;
    void on_gpu(const CommState&, int32_t rank, uint8_t op, const proto::GpuRecord& r) override {
      gpu.emplace_back(rank, op, r);
    }
  } seen;
  ingest.add_observer(&seen);
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);  // offset realtime - monotonic = 5 ms
  ingest.on_agent_message("conn-1", batch(1, 0, 2), out);  // pid 10 holds rank 1 of 0xc0ffee
  auto gpu = [](uint32_t pid, int32_t rank, uint64_t comm) {
    proto::GpuBlock block;
    block.pid = pid;
    block.comm_hash = comm;
    block.rank = rank;
    block.op = RS_OP_ALLREDUCE;
    block.records = {proto::GpuRecord{0, 256, 2'000, 2'500, 9'000}, proto::GpuRecord{1, 256, 2'100, 9'100, 12'000}};
    return block;
  };
  testing::AgentBatch b;
  b.seq = 2;
  b.instance = 99;
  b.gpu = {gpu(10, 1, 0xc0ffee), gpu(11, 1, 0xc0ffee) /* another process claims rank 1 */,
           gpu(10, 0, 0xc0ffee) /* a rank no one holds yet */, gpu(10, 1, 0xbad) /* an unknown communicator */};
  ingest.on_agent_message("conn-1", b.bytes(), out);
  ingest.on_agent_message("conn-1", b.bytes(), out);  // re-sent: already taken
  ASSERT_EQ(seen.gpu.size(), 2u);
  auto [rank, op, first] = seen.gpu[0];
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(op, RS_OP_ALLREDUCE);
  EXPECT_EQ(first.seq, 0u);
  EXPECT_EQ(first.enqueued_ns, 2'000u + 5'000'000u);
  EXPECT_EQ(first.kernel_start_ns, 2'500u + 5'000'000u);
  EXPECT_EQ(first.kernel_end_ns, 9'000u + 5'000'000u);
  EXPECT_EQ(std::get<2>(seen.gpu[1]).kernel_start_ns, 9'100u + 5'000'000u);
  EXPECT_EQ(ingest.counters().gpu_records, 2u);
  EXPECT_EQ(ingest.counters().gpu_unmatched, 6u);
  EXPECT_EQ(ingest.counters().refused_claims, 1u) << "the other process's claim on rank 1";
}

TEST_F(IngestTest, NewerProtocolIsRefusedWithAReason) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1", wire::PROTOCOL_VERSION + 1), out);
  ASSERT_EQ(out.now.size(), 1u);
  bool accepted = true;
  std::string reason;
  ASSERT_TRUE(proto::read_packed<wire::CollectorMessage>(out.now[0].second, proto::ReadLimits{}, [&](auto m) {
    accepted = m.getHelloReply().getAccepted();
    reason = m.getHelloReply().getReason();
  }));
  EXPECT_FALSE(accepted);
  EXPECT_NE(reason.find("upgrade the collector"), std::string::npos);
}

// A batch as an agent sends it to this collector (a table, compressed) is
// stored as the same batch sent plain; a compressed message that is not a
// batch, or would grow past its bound, is refused with a reason.
TEST_F(IngestTest, ACompactBatchIsStoredAsItsPlainTwinAndABadOneIsRefusedWithAReason) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ASSERT_EQ(out.now.size(), 1u);
  ASSERT_TRUE(proto::read_packed<wire::CollectorMessage>(
      out.now[0].second, proto::ReadLimits{}, [&](auto m) { EXPECT_TRUE(m.getHelloReply().getReadsCompact()); }));
  ingest.on_agent_message("conn-1", batch(1, 0, 5, 99, true), out);
  ASSERT_EQ(out.after_commit.size(), 1u);
  EXPECT_EQ(kind_of(out.after_commit[0].second), wire::CollectorMessage::ACK);
  ASSERT_TRUE(commit.run(0));
  auto records = store->tail(0xc0ffee, 0, 1, 0);
  ASSERT_TRUE(records);
  ASSERT_EQ(records->size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ((*records)[i].call.seq, i);
    EXPECT_EQ((*records)[i].call.issue_ns, 2'000u + i * 100 + 5'000'000u);
    EXPECT_EQ((*records)[i].call.count, 256u);
  }
  EXPECT_EQ(ingest.counters().bad_messages, 0u);

  Outbox bad;
  ingest.on_agent_message("conn-1", proto::encode_compressed(hello("gpu-1")), bad);
  EXPECT_EQ(ingest.counters().bad_messages, 1u);
  const std::string zeros(8u << 20, '\0');  // 8 MiB from a frame of a few hundred bytes
  ingest.on_agent_message("conn-1", proto::encode_compressed(zeros), bad);
  EXPECT_EQ(ingest.counters().bad_messages, 2u);
  ASSERT_EQ(bad.now.size(), 1u);
  EXPECT_EQ(kind_of(bad.now[0].second), wire::CollectorMessage::ERROR);
  EXPECT_TRUE(bad.after_commit.empty());
}

TEST_F(IngestTest, GarbageIsCountedAndAnswered) {
  Outbox out;
  ingest.on_agent_message("conn-1", std::string("\x01\x02\x03 not capnp", 14), out);
  EXPECT_EQ(ingest.counters().bad_messages, 1u);
  ASSERT_EQ(out.now.size(), 1u);
  EXPECT_EQ(kind_of(out.now[0].second), wire::CollectorMessage::ERROR);
}

TEST_F(IngestTest, StateSurvivesARestart) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", batch(1, 0, 3), out);
  ASSERT_TRUE(commit.run(0));
  // A later commit that moves only the member's counters (the communicator
  // is not written whole again: its progress row is).
  ingest.on_agent_message("conn-1", batch(2, 3, 5), out);
  ASSERT_TRUE(commit.run(0));
  testing::StoreCommit restarted_commit{*store};
  Ingest restarted(*store, restarted_commit, clock);
  ASSERT_TRUE(restarted.restore());
  ASSERT_EQ(restarted.comms().count(0xc0ffee), 1u);
  const MemberState& member = restarted.comms().at(0xc0ffee).members.at(1);
  EXPECT_EQ(member.last_seq, 7);
  EXPECT_EQ(member.records, 8u);
  EXPECT_EQ(member.node, "gpu-1");
  EXPECT_EQ(restarted.nodes().count("gpu-1"), 1u);
}

// Every drop reason an agent reports (common/drops.h) reaches the node
// model, survives a restart, and is never lowered by an older message.
TEST_F(IngestTest, EveryDropCountIsKeptAcrossARestartAndNeverLowered) {
  auto with_drops = [](std::string packed, uint64_t base) {
    capnp::MallocMessageBuilder copy;
    EXPECT_TRUE(proto::read_packed<wire::AgentMessage>(packed, proto::ReadLimits{}, [&](auto m) { copy.setRoot(m); }));
    DropCounts drops;
    uint64_t value = base;
    for (const DropReason& reason : kDropReasons) drops.*reason.count = value++;
    proto::write_drops(drops, copy.getRoot<wire::AgentMessage>().getBatch().getDrops());
    return std::pair{proto::to_packed(copy), drops};
  };
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  auto [newer, drops] = with_drops(batch(2, 3, 1), 100);
  auto [older, ignored] = with_drops(batch(1, 0, 3), 1);  // a re-send of an earlier batch, arriving after
  ingest.on_agent_message("conn-1", newer, out);
  ingest.on_agent_message("conn-1", older, out);
  ASSERT_TRUE(commit.run(0));
  EXPECT_EQ(ingest.node("gpu-1")->drops, drops);
  testing::StoreCommit restarted_commit{*store};
  Ingest restarted(*store, restarted_commit, clock);
  ASSERT_TRUE(restarted.restore());
  ASSERT_NE(restarted.node("gpu-1"), nullptr);
  EXPECT_EQ(restarted.node("gpu-1")->drops, drops);
}

TEST_F(IngestTest, StoredBatchesAreKnownAfterARestartOfTheCollectorAndOfTheAgent) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", batch(1, 0, 3), out);
  ingest.on_agent_message("conn-1", batch(2, 3, 3), out);
  ASSERT_TRUE(commit.run(0));

  // The collector is killed before the acks left; it restarts, the agent says hello again and re-sends.
  testing::StoreCommit restarted_commit{*store};
  Ingest restarted(*store, restarted_commit, clock);
  ASSERT_TRUE(restarted.restore());
  Outbox again;
  restarted.on_agent_message("conn-2", hello("gpu-1", wire::PROTOCOL_VERSION, 99, 9'000'000), again);
  restarted.on_agent_message("conn-2", batch(2, 3, 3), again);
  EXPECT_EQ(restarted.counters().duplicate_batches, 1u) << "stored before the restart: acked, not stored again";
  EXPECT_EQ(restarted.comms().at(0xc0ffee).members.at(1).records, 6u);

  // The agent restarts too (a new instance) and replays its spool: the old
  // instance's batches under their own id, then its own.
  restarted.on_agent_message("conn-3", hello("gpu-1", wire::PROTOCOL_VERSION, 100, 9'000'000), again);
  restarted.on_agent_message("conn-3", batch(1, 0, 3, 99), again);
  restarted.on_agent_message("conn-3", batch(3, 6, 2, 99), again);
  restarted.on_agent_message("conn-3", batch(1, 8, 2, 100), again);
  ASSERT_TRUE(restarted_commit.run(0));
  EXPECT_EQ(restarted.counters().duplicate_batches, 2u);
  EXPECT_EQ(restarted.counters().records_stored, 4u);
  EXPECT_EQ(restarted.comms().at(0xc0ffee).members.at(1).records, 10u);
  EXPECT_EQ(*store->count(0xc0ffee, 0, 1), 10u);
  // Times keep the clock fit of the earlier run (5 ms), not the new hello's wall clock (9 ms).
  auto records = store->tail(0xc0ffee, 0, 1, 0);
  ASSERT_TRUE(records);
  EXPECT_EQ(records->back().call.issue_ns, 2'000u + 100u + 5'000'000u);

  // And the windows of both instances survive another restart.
  testing::StoreCommit third_commit{*store};
  Ingest third(*store, third_commit, clock);
  ASSERT_TRUE(third.restore());
  Outbox last;
  third.on_agent_message("conn-4", hello("gpu-1", wire::PROTOCOL_VERSION, 100), last);
  third.on_agent_message("conn-4", batch(3, 6, 2, 99), last);
  third.on_agent_message("conn-4", batch(1, 8, 2, 100), last);
  EXPECT_EQ(third.counters().duplicate_batches, 2u);
  EXPECT_TRUE(last.after_commit.empty());
}

TEST_F(IngestTest, AMissingBatchIsAGapUntilItComesOrIsWaitedForTooLong) {
  // The detector scores a collective only once its ranks' earlier calls
  // are all in: a batch missing below a stored one is a gap of its node.
  Outbox out;
  clock.now = 1'000'000'000'000ull;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", batch(1, 0, 2), out);
  EXPECT_TRUE(ingest.model().gaps.empty());
  ingest.on_agent_message("conn-1", batch(3, 4, 2), out);  // 2 lost on the way
  ingest.on_agent_message("conn-1", batch(5, 8, 2), out);  // and 4
  ASSERT_EQ(ingest.model().gaps.count("gpu-1"), 1u);
  EXPECT_EQ(ingest.node("gpu-1")->gap_seq, 2u);
  EXPECT_EQ(ingest.node("gpu-1")->gap_since_ns, clock.now);
  ingest.on_agent_message("conn-1", batch(2, 2, 2), out);  // re-sent: 4 is still missing
  EXPECT_EQ(ingest.node("gpu-1")->gap_seq, 4u);
  ingest.on_agent_message("conn-1", batch(4, 6, 2), out);
  EXPECT_TRUE(ingest.model().gaps.empty());
  EXPECT_EQ(ingest.node("gpu-1")->gap_seq, 0u);

  // One that never comes (its agent gave it up) is waited for kBatchGapWaitNs, then taken as lost.
  ingest.on_agent_message("conn-1", batch(7, 12, 2), out);
  EXPECT_EQ(ingest.node("gpu-1")->gap_seq, 6u);
  clock.now += kBatchGapWaitNs;
  ingest.on_agent_message("conn-1", batch(8, 14, 2), out);
  EXPECT_EQ(ingest.node("gpu-1")->gap_seq, 0u);
  EXPECT_TRUE(ingest.model().gaps.empty());
  // A later gap is a gap again.
  ingest.on_agent_message("conn-1", batch(10, 18, 2), out);
  EXPECT_EQ(ingest.node("gpu-1")->gap_seq, 9u);
  // A new agent instance numbers its batches afresh: no gap.
  ingest.on_agent_message("conn-2", hello("gpu-1", wire::PROTOCOL_VERSION, 100), out);
  EXPECT_TRUE(ingest.model().gaps.empty());
  ingest.on_agent_message("conn-2", batch(1, 20, 2, 100), out);
  EXPECT_TRUE(ingest.model().gaps.empty());
  ingest.on_agent_message("conn-2", batch(9, 30, 2, 99), out);  // the old instance's spool, replayed
  EXPECT_TRUE(ingest.model().gaps.empty());

  // The collector restarts: the agent's next batch follows the ones stored before, no gap.
  ASSERT_TRUE(commit.run(0));
  testing::StoreCommit restarted_commit{*store};
  Ingest restarted(*store, restarted_commit, clock);
  ASSERT_TRUE(restarted.restore());
  restarted.on_agent_message("conn-3", hello("gpu-1", wire::PROTOCOL_VERSION, 100), out);
  restarted.on_agent_message("conn-3", batch(2, 22, 2, 100), out);
  EXPECT_TRUE(restarted.model().gaps.empty());
  restarted.on_agent_message("conn-3", batch(4, 26, 2, 100), out);
  EXPECT_EQ(restarted.node("gpu-1")->gap_seq, 3u);
}

// (A batch whose commit failed stays in the window: the commit protocol
// writes it with the next commit, collector/commit.h.)
// A heartbeat of gpu-1 saying how process 10 is.
std::string heartbeat(bool alive) {
  capnp::MallocMessageBuilder message;
  auto hb = message.initRoot<wire::AgentMessage>().initHeartbeat();
  hb.setInstanceId(99);
  auto p = hb.initProcesses(1);
  p[0].setPid(10);
  p[0].setAlive(alive);
  p[0].setState(alive ? 'S' : 'X');
  p[0].setSampleNs(5'000);
  return proto::to_packed(message);
}

// A batch announcing communicators `first`..`first + n - 1`, each of `nranks`
// ranks (-1: a split child's, not known yet) with process 10 as rank 0, and
// ending `ended` of them (from `first`).
std::string announce(uint64_t seq, uint64_t first, size_t n, int32_t nranks, size_t ended = 0,
                     wire::CommOrigin origin = wire::CommOrigin::INIT_RANK) {
  testing::AgentBatch b;
  b.instance = 99;
  b.seq = seq;
  for (unsigned i = 0; i < n; ++i) {
    b.comms.push_back(testing::member(10, first + i, 0, nranks));
    b.comms.back().origin = origin;
  }
  for (unsigned i = 0; i < ended; ++i) b.comm_ends.emplace_back(10, first + i);
  return b.bytes();
}

// Detail on demand: a heartbeat of a node asked for NCCL's proxy steps is
// answered with the communicators wanted of it; once none is, with an empty
// request, once; then with nothing. Another node hears nothing.
TEST_F(IngestTest, AHeartbeatIsAnsweredWithTheProxyStepsWantedOfItsNode) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-2", hello("gpu-2"), out);
  ingest.on_agent_message("conn-3", hello("gpu-3", wire::PROTOCOL_VERSION, 99, 5'000'000, false), out);
  auto detail_replies = [&](const std::string& conn) {
    Outbox reply;
    ingest.on_agent_message(conn, heartbeat(true), reply);
    std::vector<std::vector<uint64_t>> got;
    for (const auto& [id, bytes] : reply.now) {
      EXPECT_EQ(id, conn);
      EXPECT_TRUE(proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto m) {
        ASSERT_EQ(m.which(), wire::CollectorMessage::DETAIL);
        std::vector<uint64_t> comms;
        for (uint64_t c : m.getDetail().getComms()) comms.push_back(c);
        got.push_back(comms);
      }));
    }
    return got;
  };
  EXPECT_TRUE(detail_replies("conn-1").empty()) << "nothing wanted: no reply";
  ingest.set_detail_wanted({{"gpu-1", {0xc0ffee, 0xbeef}}});
  EXPECT_EQ(detail_replies("conn-1"), (std::vector<std::vector<uint64_t>>{{0xc0ffee, 0xbeef}}));
  EXPECT_EQ(detail_replies("conn-1"), (std::vector<std::vector<uint64_t>>{{0xc0ffee, 0xbeef}})) << "renewed";
  EXPECT_TRUE(detail_replies("conn-2").empty());
  ingest.set_detail_wanted({{"gpu-1", {0xc0ffee}}, {"gpu-3", {0xc0ffee}}});
  EXPECT_TRUE(detail_replies("conn-3").empty()) << "an agent that does not read DetailRequest is never sent it";
  ingest.set_detail_wanted({});
  EXPECT_EQ(detail_replies("conn-1"), (std::vector<std::vector<uint64_t>>{{}})) << "told once that none is";
  EXPECT_TRUE(detail_replies("conn-1").empty());
}

// A heartbeat's open GPU collective with a send step held by the network:
// its peer and since when, on the cluster clock.
TEST_F(IngestTest, AnOpenGpuCollectivesHeldSendIsOnTheClusterClock) {
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);  // offset 5 ms
  ingest.on_agent_message("conn-1", batch(1, 0, 2), out);
  capnp::MallocMessageBuilder message;
  auto hb = message.initRoot<wire::AgentMessage>().initHeartbeat();
  hb.setInstanceId(99);
  auto p = hb.initProcesses(1);
  p[0].setPid(10);
  p[0].setAlive(true);
  p[0].setState('S');
  p[0].setSampleNs(5'000);
  auto open = hb.initGpuOpen(2);
  for (unsigned i = 0; i < 2; ++i) {
    open[i].setPid(10);
    open[i].setCommHash(0xc0ffee);
    open[i].setRank(1);
    open[i].setOp(i == 0 ? RS_OP_ALLREDUCE : RS_OP_ALLGATHER);
    open[i].setSeq(4);
    open[i].setEnqueuedNs(3'000);
    open[i].setKernelStartNs(3'500);
    open[i].setProxySteps(true);
    open[i].setDetail(i == 0);
    open[i].setSendPeer(0);
    open[i].setSendSinceNs(i == 0 ? 3'900 : 0);  // the second: a peer with no time, so none
  }
  ingest.on_agent_message("conn-1", proto::to_packed(message), out);
  const auto& gpu = ingest.node("gpu-1")->health.at(10).gpu_open();
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_TRUE(gpu[0].proxy_steps);
  EXPECT_TRUE(gpu[0].detail);
  EXPECT_FALSE(gpu[1].detail);
  EXPECT_EQ(gpu[0].send_peer, 0);
  EXPECT_EQ(gpu[0].send_since_ns, 3'900u + 5'000'000u);
  EXPECT_EQ(gpu[1].send_peer, -1);
  EXPECT_EQ(gpu[1].send_since_ns, 0u);
}

TEST_F(IngestTest, ACommunicatorWhoseProcessesExitedLeavesTheLiveModelOnceQuietAndStaysInTheDatabase) {
  constexpr uint64_t kQuiet = 600'000'000'000ull;
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", batch(1, 0, 3), out);
  ASSERT_TRUE(commit.run(0));
  ASSERT_EQ(ingest.node("gpu-1")->memberships, 1u);
  ASSERT_EQ(ingest.node("gpu-1")->rank_slots, 2u);
  const uint64_t last = ingest.comms().at(0xc0ffee).last_ns;

  // Its process alive: a job hung for an hour is kept, however quiet.
  ingest.on_agent_message("conn-1", heartbeat(true), out);
  EXPECT_EQ(ingest.retire(last + 6 * kQuiet, kQuiet), 0u);
  ASSERT_EQ(ingest.comms().count(0xc0ffee), 1u);

  ingest.on_agent_message("conn-1", heartbeat(false), out);
  EXPECT_EQ(ingest.retire(last + kQuiet - 1, kQuiet), 0u) << "retired before it was quiet for long enough";
  EXPECT_EQ(ingest.retire(last + kQuiet, kQuiet), 1u);
  EXPECT_EQ(ingest.comms().count(0xc0ffee), 0u);
  EXPECT_EQ(ingest.process("gpu-1", 10), nullptr) << "who an exited process of no live communicator was is kept";
  EXPECT_EQ(ingest.counters().retired_comms, 1u);
  EXPECT_EQ(ingest.node("gpu-1")->memberships, 0u);
  EXPECT_EQ(ingest.node("gpu-1")->rank_slots, 0u);
  ASSERT_TRUE(commit.run(0));

  // A restart does not load it again; a query of its timeline still finds it.
  testing::StoreCommit restarted_commit{*store};
  Ingest restarted(*store, restarted_commit, clock);
  ASSERT_TRUE(restarted.restore());
  EXPECT_TRUE(restarted.comms().empty());
  auto retired = restarted.retired_comm("0000000000c0f");
  ASSERT_TRUE(retired) << retired.error().message;
  EXPECT_EQ(retired->hash, 0xc0ffeeu);
  EXPECT_EQ(retired->job, "job-7");
  ASSERT_EQ(retired->members.count(1), 1u);
  EXPECT_EQ(retired->members.at(1).records, 3u);
  EXPECT_EQ(retired->members.at(1).last_seq, 2);
  EXPECT_EQ(restarted.retired_comm("ff").error().code, Errc::not_found);
}

TEST_F(IngestTest, ACommunicatorEveryMemberEndedRetiresWhileItsProcessLivesOn) {
  constexpr uint64_t kQuiet = 1'000'000'000ull;
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", heartbeat(true), out);
  ingest.on_agent_message("conn-1", announce(1, 500, 2, 4, 1), out);
  ASSERT_TRUE(commit.run(0));
  ASSERT_TRUE(ingest.comms().at(500).ended);
  ASSERT_FALSE(ingest.comms().at(501).ended);
  EXPECT_EQ(ingest.retire(clock.now + kQuiet, kQuiet), 1u);
  EXPECT_EQ(ingest.comms().count(500), 0u);
  EXPECT_EQ(ingest.comms().count(501), 1u);
  EXPECT_EQ(ingest.node("gpu-1")->rank_slots, 4u);
  EXPECT_EQ(ingest.node("gpu-1")->memberships, 1u);
}

// A user's stand-in libnccl.so announcing communicators of 65,536 ranks in a
// loop: every observer would size per-rank state for each. The node's live
// communicators may total kMaxRankSlotsPerNode ranks; past it, claims are
// refused and counted, until communicators retire and give their slots back.
TEST_F(IngestTest, ANodeIsRefusedCommunicatorsPastItsRankSlotsUntilSomeRetire) {
  constexpr int32_t kBig = 1 << 16;
  constexpr size_t kFit = kMaxRankSlotsPerNode / kBig;  // 16
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", announce(1, 1000, kFit, kBig), out);
  ASSERT_TRUE(commit.run(0));
  EXPECT_EQ(ingest.comms().size(), kFit);
  EXPECT_EQ(ingest.node("gpu-1")->rank_slots, kMaxRankSlotsPerNode);
  EXPECT_EQ(ingest.node("gpu-1")->refused_claims, 0u);

  ingest.on_agent_message("conn-1", announce(2, 5000, 1, kBig), out);
  EXPECT_EQ(ingest.comms().count(5000), 0u) << "a refused claim left its communicator in the model";
  EXPECT_EQ(ingest.node("gpu-1")->refused_claims, 1u);
  // A small one is refused too: the cap is on the sum.
  ingest.on_agent_message("conn-1", announce(3, 6000, 1, 2), out);
  EXPECT_EQ(ingest.comms().count(6000), 0u);
  EXPECT_EQ(ingest.node("gpu-1")->refused_claims, 2u);
  ASSERT_TRUE(commit.run(0));

  // The big ones end and retire: their slots come back.
  ingest.on_agent_message("conn-1", announce(4, 1000, kFit, kBig, kFit), out);
  ASSERT_TRUE(commit.run(0));
  EXPECT_EQ(ingest.retire(clock.now + 1, 1), kFit);
  EXPECT_EQ(ingest.node("gpu-1")->rank_slots, 0u);
  ingest.on_agent_message("conn-1", announce(5, 5000, 1, kBig), out);
  EXPECT_EQ(ingest.comms().count(5000), 1u);
  EXPECT_EQ(ingest.node("gpu-1")->refused_claims, 2u);
}

// Slots are charged for a communicator whose size is learnt after its members
// joined (one each until then), and so cannot be dodged that way.
TEST_F(IngestTest, ACommunicatorSizedAfterItsMembersJoinedIsChargedItsSize) {
  constexpr int32_t kBig = 1 << 16;
  Outbox out;
  ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  ingest.on_agent_message("conn-1", announce(1, 1000, 17, -1, 0, wire::CommOrigin::SPLIT), out);
  ASSERT_TRUE(commit.run(0));
  EXPECT_EQ(ingest.node("gpu-1")->rank_slots, 17u);
  ingest.on_agent_message("conn-1", announce(2, 1000, 17, kBig), out);
  ASSERT_TRUE(commit.run(0));
  // 15 sized (65,535 more each); the 16th would pass the cap.
  EXPECT_EQ(ingest.node("gpu-1")->rank_slots, 17 + 15 * static_cast<uint64_t>(kBig - 1));
  EXPECT_EQ(ingest.comms().at(1014).nranks, kBig);
  EXPECT_EQ(ingest.comms().at(1015).nranks, -1);
  EXPECT_EQ(ingest.node("gpu-1")->refused_claims, 2u);
}

TEST(AckWindow, RemembersOutOfOrderBatches) {
  AckWindow window;
  for (uint64_t seq : {1, 2, 4, 5, 3, 7}) window.insert(seq);
  EXPECT_EQ(window.through, 5u);
  EXPECT_EQ(window.above, (std::set<uint64_t>{7}));
  EXPECT_FALSE(window.contains(6));
  EXPECT_TRUE(window.contains(7));
  window.insert(6);
  EXPECT_EQ(window.through, 7u);
  EXPECT_TRUE(window.above.empty());
}

// The stored-batch windows of a node: the least recently used go past
// AckBook::kInstances, never the agent's current instance (which, in a
// fleet, numbers no batch) nor a stream still in use, however old.
TEST(AckBookTest, WindowsGoLeastRecentlyUsedFirstAndNeverTheCurrentInstance) {
  AckBook acks;
  NodeState node;
  node.name = "n";
  node.instance = 1;
  acks.new_instance(node);
  const uint64_t busy = 1000;  // a job's stream that keeps sending
  acks.mark_stored(node, busy, 1);
  for (uint64_t stream = 2; stream < 2 + 3 * AckBook::kInstances; ++stream) {
    acks.mark_stored(node, stream, 1);
    acks.mark_stored(node, busy, stream);
  }
  EXPECT_LE(node.acked.size(), AckBook::kInstances + 1);
  EXPECT_TRUE(node.acked.count(1)) << "the current instance stays";
  ASSERT_TRUE(node.acked.count(busy)) << "a stream in use stays, however long ago it began";
  EXPECT_EQ(acks.seen(node, busy, 1), AckBook::Seen::pending) << "its first batch is still known";
  EXPECT_FALSE(node.acked.count(2)) << "the least recently used went";
}

}  // namespace
}  // namespace rankscope::collector
