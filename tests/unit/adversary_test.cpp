// What a user on a GPU node can make the collector hear (their own stand-in
// libnccl decides a communicator's size, its ranks and its unique id, and the
// real agent reports it), and what an admitted agent can say: each case is a
// finding of the security review (docs/operations.md, "Threat model"), on the
// real ingest, detector, clock refiner and usage ledger over a real RocksDB.
// The sanitizer build of the same inputs is the fuzz tree's
// (tests/fuzz/agent_message_fuzz.cpp replays them as seeds).
#include <gtest/gtest.h>

#include <functional>

#include "collector/service.h"
#include "common/format.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"

namespace rankscope::collector {
namespace {

using FixedClock = testing::ManualClock;

std::string hello(const std::string& node, uint64_t instance) {
  return testing::hello_message(node, instance, 1'800'000'000'000'000'000ull, 1'000);
}

struct Claim {
  uint64_t comm;
  uint32_t pid;
  int32_t rank, nranks;
};
struct Calls {
  uint64_t comm;
  uint32_t pid;
  int32_t rank;
  uint64_t first_seq;
  size_t count;
  uint64_t issue_ns = 2'000;  // node clock
};
struct End {
  uint64_t comm;
  uint32_t pid;
};

std::string batch(uint64_t instance, uint64_t seq, const std::vector<Claim>& claims, const std::vector<Calls>& calls,
                  const std::vector<End>& ends = {}) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(instance);
  b.setSeq(seq);
  auto comms = b.initComms(static_cast<unsigned>(claims.size()));
  for (unsigned i = 0; i < claims.size(); ++i) {
    comms[i].setCommHash(claims[i].comm);
    comms[i].setPid(claims[i].pid);
    comms[i].setRank(claims[i].rank);
    comms[i].setNranks(claims[i].nranks);
    comms[i].setOrigin(wire::CommOrigin::INIT_RANK);
  }
  auto end_list = b.initCommEnds(static_cast<unsigned>(ends.size()));
  for (unsigned i = 0; i < ends.size(); ++i) {
    end_list[i].setCommHash(ends[i].comm);
    end_list[i].setPid(ends[i].pid);
  }
  std::vector<proto::ColumnBlock> blocks(calls.size());
  std::vector<const proto::ColumnBlock*> pointers;
  for (size_t k = 0; k < calls.size(); ++k) {
    proto::ColumnBlock& block = blocks[k];
    block.pid = calls[k].pid;
    block.comm_hash = calls[k].comm;
    block.rank = calls[k].rank;
    for (size_t i = 0; i < calls[k].count; ++i) {
      proto::CallRecord r;
      r.seq = calls[k].first_seq + i;
      r.issue_ns = calls[k].issue_ns + i * 1'000;
      r.return_ns = r.issue_ns + 10;
      r.count = 256;
      r.op = RS_OP_ALLREDUCE;
      block.records.push_back(r);
    }
    pointers.push_back(&block);
  }
  proto::encode_collectives(pointers, b);
  return proto::to_packed(message);
}

class AdversaryTest : public ::testing::Test {
 protected:
  AdversaryTest() {
    say("conn-1", hello("gpu-1", 1), "gpu-1");
    say("conn-2", hello("gpu-2", 2), "gpu-2");
  }
  Outbox say(const std::string& connection, const std::string& bytes, const std::string& key_node) {
    Outbox out;
    ingest.on_agent_message(connection, bytes, out, key_node);
    return out;
  }
  // A batch from node gpu-1 or gpu-2 over its own connection and key.
  Outbox from(int node, const std::vector<Claim>& claims, const std::vector<Calls>& calls,
              const std::vector<End>& ends = {}) {
    uint64_t instance = static_cast<uint64_t>(node);
    std::string name = "gpu-" + std::to_string(node);
    Outbox out = say("conn-" + std::to_string(node), batch(instance, ++seq_[node], claims, calls, ends), name);
    EXPECT_TRUE(commit.run(clock.now));
    return out;
  }
  uint64_t refused(int node) const { return ingest.node("gpu-" + std::to_string(node))->refused_claims; }
  void evaluate() {
    service.evaluate(clock.now);
  }

  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  FixedClock clock;
  Service service{*store, clock, ServiceOptions{}};
  Commit& commit = service.commit();
  Ingest& ingest = service.ingest();
  CollectiveMatcher& matcher = service.matcher();
  Detector& detector = service.detector();
  std::map<int, uint64_t> seq_;
};

constexpr uint64_t kComm = 0xfeedface;

// The critical finding: a communicator announced with 2 ranks and one
// collective, then with 65,536 ranks and a record of rank 60,000 at the same
// sequence number. The observers' per-instance vectors were sized by the first
// size and indexed by the second: an 8-byte write far out of bounds
// (SIGSEGV in Detector::on_record; ASan: detector.cpp:157).
TEST_F(AdversaryTest, ACommunicatorCannotGrowAfterItsFirstAnnouncement) {
  from(1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 0, 1}});
  from(1, {{kComm, 11, 60'000, 65'536}}, {{kComm, 11, 60'000, 0, 1}});
  EXPECT_EQ(ingest.comms().at(kComm).nranks, 2);
  EXPECT_EQ(ingest.comms().at(kComm).members.size(), 1u);
  EXPECT_GE(refused(1), 2u);  // the new size, then the records of a rank outside it
  EXPECT_EQ(ingest.counters().refused_claims, refused(1));
  evaluate();  // the hang detector and the ledger read the same communicator
  // Nor shrink: a size below a rank it already has.
  from(1, {{kComm, 10, 0, 1}}, {});
  EXPECT_EQ(ingest.comms().at(kComm).nranks, 2);

  // The same rank and size from its own process is no news, and the job goes on.
  uint64_t before = refused(1);
  from(2, {{kComm, 20, 1, 2}}, {{kComm, 20, 1, 0, 1}});
  from(1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 1, 1}});
  EXPECT_EQ(refused(1), before);
  EXPECT_EQ(ingest.comms().at(kComm).members.at(1).node, "gpu-2");
}

// Record keys have no node in them: a rank rebound to another node's process
// would have its records overwritten by that node.
TEST_F(AdversaryTest, ANodeCannotTakeOverAnotherNodesRank) {
  from(1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 0, 5}});
  from(2, {{kComm, 20, 1, 2}}, {{kComm, 20, 1, 0, 5}});
  uint64_t stored = ingest.counters().records_stored;
  auto out = from(2, {{kComm, 21, 0, 2}}, {{kComm, 21, 0, 0, 5, 9'999'000}});
  EXPECT_EQ(out.after_commit.size(), 1u);  // acknowledged: the agent must not send it again
  EXPECT_EQ(ingest.counters().records_stored, stored);
  EXPECT_EQ(ingest.comms().at(kComm).members.at(0).node, "gpu-1");
  EXPECT_EQ(ingest.comms().at(kComm).members.at(0).pid, 10u);
  EXPECT_EQ(refused(2), 2u);  // the announcement and the block
  EXPECT_EQ(refused(1), 0u);
  // Nor from the same node with another process.
  from(1, {{kComm, 12, 0, 2}}, {});
  EXPECT_EQ(refused(1), 1u);
  EXPECT_EQ(ingest.comms().at(kComm).members.at(0).pid, 10u);
}

// One CommEnd from anyone ended any communicator: its alerts resolved and
// hang detection stopped.
TEST_F(AdversaryTest, OnlyAMemberEndsItsOwnMembership) {
  from(1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 0, 1}});
  from(2, {{kComm, 20, 1, 2}}, {});
  from(2, {}, {}, {{kComm, 99}});  // not a member: a process of the node that is none
  EXPECT_FALSE(ingest.comms().at(kComm).ended);
  EXPECT_EQ(refused(2), 1u);
  from(1, {}, {}, {{kComm, 10}});  // one member ends: the other may still hang
  EXPECT_FALSE(ingest.comms().at(kComm).ended);
  EXPECT_TRUE(ingest.comms().at(kComm).members.at(0).ended);
  from(2, {}, {}, {{kComm, 20}});
  EXPECT_TRUE(ingest.comms().at(kComm).ended);
}

TEST_F(AdversaryTest, ANodeClaimsAtMostAHostsWorthOfRanks) {
  std::vector<Claim> claims;
  for (int32_t r = 0; r < 300; ++r) claims.push_back({kComm, static_cast<uint32_t>(1000 + r), r, 65'536});
  from(1, claims, {});
  EXPECT_EQ(ingest.comms().at(kComm).members.size(), kMaxMembersPerNode);
  EXPECT_EQ(refused(1), 300 - kMaxMembersPerNode);
}

// 4,096 open single-rank instances of a 65,536-rank communicator would cost
// ~4 GiB in the matcher (once for the detector and the ledger): a loop of
// 4,096 calls.
TEST_F(AdversaryTest, OpenInstancesOfAHugeCommunicatorAreBoundedByMemory) {
  from(1, {{kComm, 10, 0, 65'536}}, {});
  for (int b = 0; b < 8; ++b) from(1, {}, {{kComm, 10, 0, static_cast<uint64_t>(b) * 512, 512}});
  EXPECT_EQ(ingest.counters().records_stored, 4096u);
  EXPECT_LE(matcher.open_bytes(), OpenBudget::kDefaultPerCommBytes);
  EXPECT_GT(matcher.open_evicted(), 0u);
  evaluate();
  EXPECT_LE(matcher.open_bytes(), OpenBudget::kDefaultPerCommBytes);

  // Across communicators: the total stays under its bound, and a small job's
  // open collectives are not what gives way.
  constexpr uint64_t kSmall = 0x5a11;
  from(2, {{kSmall, 20, 0, 2}}, {{kSmall, 20, 0, 0, 3}});
  for (uint64_t c = 1; c <= 12; ++c) {
    from(1, {{kComm + c, 10, 0, 65'536}}, {});
    from(1, {}, {{kComm + c, 10, 0, 0, 512}});
  }
  EXPECT_LE(matcher.open_bytes(), OpenBudget::kDefaultTotalBytes);
  from(2, {{kSmall, 21, 1, 2}}, {{kSmall, 21, 1, 0, 3}});  // its other rank: the three complete
  std::vector<double> lateness = detector.take_lateness_samples();
  EXPECT_EQ(lateness.size(), 3u);
}

// Columns of zeros pack to almost nothing: a block of ~100 bytes could claim
// a million records, each a RocksDB write and an observer call.
TEST_F(AdversaryTest, ABatchClaimsNoMoreRecordsThanItsBytesCanHold) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(1);
  b.setSeq(1);
  b.initCommTable(1).set(0, kComm);
  auto block = b.initCollectives(1)[0];
  block.setCount(1u << 20);
  block.initSeqGap(1u << 20);
  block.initIssueDeltaNs(1u << 20);
  block.initDurationNs(1u << 20);
  block.initCode(1u << 20);
  block.initCountDelta(1u << 20);
  block.initPeer(1u << 20);
  block.initResult(1u << 20);
  std::string bytes = proto::to_packed(message);
  ASSERT_LT(bytes.size(), 200'000u);
  Outbox out = say("conn-1", bytes, "gpu-1");
  EXPECT_TRUE(out.after_commit.empty());
  EXPECT_EQ(ingest.counters().records_stored, 0u);
  EXPECT_EQ(ingest.node("gpu-1")->bad_messages, 1u);
}

// Messages after the Hello were attributed by routing id alone.
TEST_F(AdversaryTest, AMessageIsItsKeysNotItsConnectionsHello) {
  Outbox out = say("conn-1", batch(1, 1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 0, 3}}), "gpu-2");
  EXPECT_TRUE(out.after_commit.empty());
  EXPECT_EQ(ingest.counters().records_stored, 0u);
  EXPECT_EQ(ingest.comms().count(kComm), 0u);
  EXPECT_EQ(refused(2), 1u);
}

// A record stamped in the far future would stand for the newest data and move
// the disk cap's retention cut-off past everything real.
TEST_F(AdversaryTest, RecordsFarInTheFutureAreSkipped) {
  uint64_t future = 400ull * 24 * 3600 * 1'000'000'000ull;
  from(1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 0, 2}, {kComm, 10, 0, 2, 2, future}});
  EXPECT_EQ(ingest.counters().records_stored, 2u);
  EXPECT_EQ(ingest.node("gpu-1")->bad_messages, 1u);
}

// A re-sent batch whose first copy is in the same commit round was
// acknowledged at once, before the first copy was durable.
TEST_F(AdversaryTest, ARepeatInTheSameRoundIsAcknowledgedOnlyAfterTheCommit) {
  std::string bytes = batch(1, 1, {{kComm, 10, 0, 2}}, {{kComm, 10, 0, 0, 2}});
  Outbox first = say("conn-1", bytes, "gpu-1");
  Outbox again = say("conn-1", bytes, "gpu-1");
  EXPECT_EQ(first.after_commit.size(), 1u);
  EXPECT_TRUE(again.now.empty());
  EXPECT_EQ(again.after_commit.size(), 1u);
  ASSERT_TRUE(commit.run(clock.now));
  Outbox later = say("conn-1", bytes, "gpu-1");  // durable now: at once
  EXPECT_EQ(later.now.size(), 1u);
}

TEST(ValidUtf8, ReplacesWhatIsNotUtf8) {
  EXPECT_EQ(valid_utf8("job-\xc3\xa9t\xc3\xa9"), "job-\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(valid_utf8("a\xff" "b"), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(valid_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");          // overlong '/'
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(valid_utf8("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");          // cut short
  EXPECT_EQ(valid_utf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(json_quote("\xff"), "\"\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace rankscope::collector
