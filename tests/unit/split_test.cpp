// Children of ncclCommSplit through the collector's real ingest (a real
// RocksDB): sized and ranked as NCCL does once every rank of the parent has
// said what it did in the split; their records wait with their agents until
// then and are stored under the child's own ranks; forged and incomplete
// splits (collector/ingest/split.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "collector/ingest/ingest.h"
#include "collector/match/matcher.h"
#include "node-agent/summarise.h"
#include "proto/records.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"
#include "tests/support/store_commit.h"
#include "tests/support/wire.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kParent = 0x5eed0000aa11ull;

// One rank of the parent: its node, pid, and what it did in split 1.
struct Rank {
  std::string node;
  uint32_t pid;
  int32_t color, key;
};

uint64_t child_of(int32_t color, int32_t index = 1) { return proto::comm_hash_of_split(kParent, index, color); }

proto::CallRecord allreduce(uint64_t seq) {
  proto::CallRecord r;
  r.seq = seq;
  r.issue_ns = 10'000 + seq * 1'000;
  r.return_ns = r.issue_ns + 10;
  r.count = 64;
  r.op = RS_OP_ALLREDUCE;
  r.datatype = 7;
  return r;
}

class SplitTest : public ::testing::Test {
 protected:
  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  testing::ManualClock clock;
  // A restarted collector is a new commit with a new ingest (the ingest joins its commit).
  std::unique_ptr<testing::StoreCommit> commit = std::make_unique<testing::StoreCommit>(*store);
  std::unique_ptr<Ingest> ingest = std::make_unique<Ingest>(*store, *commit, clock);
  std::map<std::string, uint64_t> sent;  // by node: the agent's last batch seq

  void hello(const std::string& node) {
    Outbox out;
    ingest->on_agent_message("conn-" + node, testing::hello_message(node, 7, clock.now, 1'000), out);
  }
  // A batch of `node`'s agent: the parent's members on it, what each did
  // in split 1 (announced by its parent rank), and `records` collectives
  // of each child it joined. Returns the batch, to be sent again.
  std::string batch(const std::string& node, const std::vector<Rank>& ranks, size_t records,
                    std::optional<uint64_t> seq = std::nullopt) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = seq ? *seq : ++sent[node];
    for (size_t r = 0; r < ranks.size(); ++r) {
      const Rank& rank = ranks[r];
      if (rank.node != node) continue;
      b.comms.push_back({rank.pid, kParent, 0x100 + r, 0, 1, 2, static_cast<int32_t>(r),
                         static_cast<int32_t>(ranks.size()), 0, wire::CommOrigin::INIT_RANK});
      b.comms.push_back({rank.pid, child_of(rank.color), rank.color == kSplitNoColor ? 0 : 0x200 + r, kParent, 3, 4,
                         static_cast<int32_t>(r), -1, 0, wire::CommOrigin::SPLIT, rank.color, rank.key, 1});
      if (rank.color == kSplitNoColor || records == 0) continue;
      proto::ColumnBlock block;
      block.pid = rank.pid;
      block.comm_hash = child_of(rank.color);
      block.rank = static_cast<int32_t>(r);  // as the agent names a child's member
      for (uint64_t s = 0; s < records; ++s) block.records.push_back(allreduce(s));
      b.calls.push_back(block);
    }
    return b.bytes();
  }
  // Sends it; true when it was acknowledged (stored).
  bool send(const std::string& node, const std::string& bytes) {
    Outbox out;
    ingest->on_agent_message("conn-" + node, bytes, out);
    EXPECT_TRUE(commit->run(0));
    return !out.after_commit.empty() || !out.now.empty();
  }
  const CommState& comm(uint64_t hash) { return ingest->comms().at(hash); }
};

// Two nodes, four ranks; color = parent rank % 2; keys that reorder color 0.
const std::vector<Rank> kFour = {
    {"gpu-1", 10, 0, 5}, {"gpu-1", 11, 1, 0}, {"gpu-2", 20, 0, 1}, {"gpu-2", 21, 1, 0}};

TEST_F(SplitTest, ChildrenAreSizedAndRankedByKeyThenParentRankOnceEveryParentRankHasSaid) {
  hello("gpu-1");
  hello("gpu-2");
  const std::string first = batch("gpu-1", kFour, 3);
  EXPECT_FALSE(send("gpu-1", first)) << "acknowledged records of a child nobody can number yet";
  EXPECT_EQ(comm(child_of(0)).nranks, -1);
  EXPECT_EQ(comm(child_of(0)).split.sizing, SplitSizing::pending);
  EXPECT_EQ(ingest->counters().split_waits, 1u);

  // The other node's members say theirs: every child is sized, and its
  // batch goes through at once.
  EXPECT_TRUE(send("gpu-2", batch("gpu-2", kFour, 3)));
  for (int32_t color : {0, 1}) {
    EXPECT_EQ(comm(child_of(color)).nranks, 2) << "color " << color;
    EXPECT_EQ(comm(child_of(color)).split.sizing, SplitSizing::derived);
  }
  // Color 0: parent ranks 0 (key 5) and 2 (key 1): by key, rank 2 first.
  EXPECT_EQ(comm(child_of(0)).members.at(0).pid, 20u);
  EXPECT_EQ(comm(child_of(0)).members.at(1).pid, 10u);
  EXPECT_EQ(comm(child_of(0)).members.at(1).announced_rank, 0);
  // Color 1: equal keys, by parent rank.
  EXPECT_EQ(comm(child_of(1)).members.at(0).pid, 11u);
  EXPECT_EQ(comm(child_of(1)).members.at(1).pid, 21u);
  EXPECT_EQ(ingest->counters().splits_sized, 2u);

  // gpu-1's agent sends its batch again: stored, under the child's ranks.
  EXPECT_TRUE(send("gpu-1", first));
  EXPECT_EQ(*store->count(child_of(0), 0, 1), 3u) << "parent rank 0 is rank 1 of its child";
  EXPECT_EQ(*store->count(child_of(0), 0, 0), 3u);
  EXPECT_EQ(*store->count(child_of(1), 0, 0), 3u);
  EXPECT_EQ(*store->count(child_of(1), 0, 1), 3u);
  EXPECT_EQ(ingest->node("gpu-1")->refused_claims + ingest->node("gpu-2")->refused_claims, 0u);

  // A restarted collector knows the numbering: a later batch is stored alike.
  ingest.reset();
  commit = std::make_unique<testing::StoreCommit>(*store);
  ingest = std::make_unique<Ingest>(*store, *commit, clock);
  ASSERT_TRUE(ingest->restore());
  EXPECT_EQ(comm(child_of(0)).nranks, 2);
  hello("gpu-1");
  testing::AgentBatch b;
  b.instance = 7;
  b.seq = ++sent["gpu-1"];
  proto::ColumnBlock block;
  block.pid = 10;
  block.comm_hash = child_of(0);
  block.rank = 0;
  block.records.push_back(allreduce(3));
  b.calls = {block};
  EXPECT_TRUE(send("gpu-1", b.bytes()));
  EXPECT_EQ(*store->count(child_of(0), 0, 1), 4u);
}

// The matcher sees a sized child's collectives complete: what the
// detectors and the ledger are fed.
TEST_F(SplitTest, ASizedChildsCollectivesAreMatched) {
  CollectiveMatcher matcher;
  ingest->add_observer(&matcher);
  struct Completions : MatchListener {
    std::map<uint64_t, size_t> by_comm;
    void on_complete(const CollectiveComplete& done) override { ++by_comm[done.comm.hash]; }
  } completions;
  matcher.subscribe(completions);
  hello("gpu-1");
  hello("gpu-2");
  const std::string first = batch("gpu-1", kFour, 4);
  send("gpu-1", first);
  send("gpu-2", batch("gpu-2", kFour, 4));
  send("gpu-1", first);
  EXPECT_EQ(completions.by_comm[child_of(0)], 4u);
  EXPECT_EQ(completions.by_comm[child_of(1)], 4u);
}

// NCCL_SPLIT_NOCOLOR: a rank that takes part and gets no child. Its word
// is what completes the split.
TEST_F(SplitTest, ARankWithoutAColorCompletesTheSplit) {
  const std::vector<Rank> three = {{"gpu-1", 10, 0, 0}, {"gpu-1", 11, kSplitNoColor, 0}, {"gpu-2", 20, 0, 0}};
  hello("gpu-1");
  hello("gpu-2");
  // gpu-2 first, then gpu-1's member with a color but not yet the one without.
  EXPECT_TRUE(send("gpu-2", batch("gpu-2", three, 0)));
  EXPECT_EQ(comm(child_of(0)).split.sizing, SplitSizing::pending);
  EXPECT_TRUE(send("gpu-1", batch("gpu-1", three, 0)));
  EXPECT_EQ(comm(child_of(0)).nranks, 2);
  EXPECT_EQ(comm(child_of(0)).members.at(1).pid, 20u);
  EXPECT_FALSE(ingest->live(child_of(kSplitNoColor))) << "the ranks without a child are not a communicator to watch";
}

// Only the parent's own member may speak for its rank, and only of a child
// NCCL would name so.
TEST_F(SplitTest, ForgedSplitAnnouncementsAreRefused) {
  hello("gpu-1");
  hello("gpu-2");
  EXPECT_TRUE(send("gpu-1", batch("gpu-1", kFour, 0)));
  const uint64_t refused = ingest->node("gpu-2")->refused_claims;
  auto forged = [&](uint32_t pid, int32_t rank, uint64_t hash) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++sent["gpu-2"];
    b.comms = {{pid, hash, 0x999, kParent, 3, 4, rank, -1, 0, wire::CommOrigin::SPLIT, 1, 0, 1}};
    return b.bytes();
  };
  // gpu-2 speaking for rank 0, which is gpu-1's pid 10.
  send("gpu-2", forged(10, 0, child_of(1)));
  EXPECT_EQ(ingest->node("gpu-2")->refused_claims, refused + 1);
  // Its own rank 2, but a hash that is not NCCL's name for color 1 of split 1.
  send("gpu-2", batch("gpu-2", kFour, 0));
  send("gpu-2", forged(20, 2, 0xf00d));
  EXPECT_EQ(ingest->node("gpu-2")->refused_claims, refused + 2);
  EXPECT_EQ(ingest->comms().count(0xf00d), 0u);
}

// A split some rank never speaks of (its agent is down) is abandoned after
// the grace: its records are taken, kept by the ranks their agents named,
// and never matched.
TEST_F(SplitTest, ASplitNeverCompletedIsAbandonedAfterTheGraceAndItsRecordsAreKept) {
  hello("gpu-1");
  const std::string first = batch("gpu-1", kFour, 2);
  EXPECT_FALSE(send("gpu-1", first));
  const std::string second = batch("gpu-1", kFour, 2);
  EXPECT_FALSE(send("gpu-1", second)) << "a later batch of the same agent went ahead of a waiting one";
  clock.now += kSplitSizingGraceNs + 1;
  EXPECT_TRUE(send("gpu-1", first));
  EXPECT_TRUE(send("gpu-1", second));
  EXPECT_EQ(comm(child_of(0)).split.sizing, SplitSizing::abandoned);
  EXPECT_EQ(comm(child_of(0)).nranks, -1);
  EXPECT_EQ(*store->count(child_of(0), 0, 0), 2u);
  EXPECT_EQ(ingest->counters().splits_abandoned, 2u);
}

// A child split again within a batch interval of its own split: the
// grandchild's announcement travels with the child's, before every member
// of the child's parent said what it did. It waits for the child to be
// sized (it was abandoned: nothing found on it for the rest of the job),
// then is sized as any split, under the child's ranks.
TEST_F(SplitTest, ASplitOfAChildNotYetSizedWaitsForItAndIsSizedAfter) {
  auto grandchild_of = [](int32_t color) { return proto::comm_hash_of_split(child_of(color), 1, 7); };
  auto nested = [&](const std::string& node) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++sent[node];
    for (size_t r = 0; r < kFour.size(); ++r) {
      const Rank& rank = kFour[r];
      if (rank.node != node) continue;
      const auto announced = static_cast<int32_t>(r);
      b.comms.push_back({rank.pid, kParent, 0x100 + r, 0, 1, 2, announced, 4, 0, wire::CommOrigin::INIT_RANK});
      b.comms.push_back({rank.pid, child_of(rank.color), 0x200 + r, kParent, 3, 4, announced, -1, 0,
                         wire::CommOrigin::SPLIT, rank.color, rank.key, 1});
      b.comms.push_back({rank.pid, grandchild_of(rank.color), 0x300 + r, child_of(rank.color), 5, 6, announced, -1, 0,
                         wire::CommOrigin::SPLIT, 7, 0, 1});
      proto::ColumnBlock block;
      block.pid = rank.pid;
      block.comm_hash = grandchild_of(rank.color);
      block.rank = announced;
      for (uint64_t s = 0; s < 2; ++s) block.records.push_back(allreduce(s));
      b.calls.push_back(block);
    }
    return b.bytes();
  };
  hello("gpu-1");
  hello("gpu-2");
  const std::string first = nested("gpu-1");
  EXPECT_FALSE(send("gpu-1", first));
  EXPECT_EQ(comm(grandchild_of(0)).split.sizing, SplitSizing::pending) << "given up while its parent was not sized";
  EXPECT_TRUE(send("gpu-2", nested("gpu-2")));
  EXPECT_TRUE(send("gpu-1", first));
  for (int32_t color : {0, 1}) {
    EXPECT_EQ(comm(grandchild_of(color)).split.sizing, SplitSizing::derived) << "color " << color;
    EXPECT_EQ(comm(grandchild_of(color)).nranks, 2) << "color " << color;
    EXPECT_EQ(*store->count(grandchild_of(color), 0, 0), 2u);
    EXPECT_EQ(*store->count(grandchild_of(color), 0, 1), 2u);
  }
  // Color 0's child ranks parent rank 2 (key 1) before parent rank 0 (key
  // 5); its own split, with equal keys, keeps that order.
  EXPECT_EQ(comm(grandchild_of(0)).members.at(0).pid, 20u);
  EXPECT_EQ(comm(grandchild_of(0)).members.at(1).pid, 10u);
  EXPECT_EQ(ingest->counters().splits_abandoned, 0u);
  EXPECT_EQ(ingest->node("gpu-1")->refused_claims + ingest->node("gpu-2")->refused_claims, 0u);
}

// A job's new collector (its owner in a fleet died) knows nothing of it:
// the agent announces its processes and communicators again, and the
// splits in which a rank got no child (NCCL_SPLIT_NOCOLOR), or the new
// collector could never size their children (every rank of the parent must
// say what it did in the split): the children's records would wait with
// the agent, then the split would be abandoned, and nothing found on them.
// A broken communicator's error goes again too. The agent is the real
// summariser; both collectors the real ingest on RocksDB.
TEST_F(SplitTest, AJobsNewCollectorSizesItsSplitsFromWhatTheAgentAnnouncesAgain) {
  testing::TempDir proc;  // an empty /proc
  agent::Summariser agent(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t a = 10, b = 11;
  auto init = [](uint32_t pid, uint8_t op, uint64_t handle, uint64_t parent, int32_t color, uint64_t ts) {
    rs_comm_init_event e{};
    e.hdr.pid = e.hdr.tid = pid;
    e.hdr.kind = RS_EV_COMM_INIT;
    e.hdr.ts_ns = ts;
    e.entry_ns = ts - 10;
    e.comm = handle;
    e.parent_comm = parent;
    e.op = op;
    e.color = color;
    e.nranks = op == RS_OP_COMM_SPLIT ? -1 : 2;
    e.rank = pid == a ? 0 : 1;
    std::memcpy(e.unique_id, "one-job", 7);
    return e;
  };
  auto calls = [&](uint64_t from, uint64_t to) {
    for (uint64_t seq = from; seq < to; ++seq) {
      rs_call_event e{};
      e.hdr.pid = e.hdr.tid = b;
      e.hdr.kind = RS_EV_CALL;
      e.hdr.ts_ns = 10'000 + seq * 1'000;
      e.entry_ns = e.hdr.ts_ns - 10;
      e.comm = 0x21;
      e.seq = seq;
      e.count = 64;
      e.peer = -1;
      e.op = RS_OP_ALLREDUCE;
      e.datatype = 7;
      agent.on_event(e);
    }
  };
  for (uint32_t pid : {a, b}) agent.on_event(init(pid, RS_OP_COMM_INIT_RANK, 0x10, 0, 0, 1'000));
  agent.on_event(init(a, RS_OP_COMM_SPLIT, 0, 0x10, kSplitNoColor, 2'000));
  agent.on_event(init(b, RS_OP_COMM_SPLIT, 0x21, 0x10, 3, 2'000));
  calls(0, 3);
  uint64_t seq = 0;
  auto send_from_agent = [&](bool again) {
    capnp::MallocMessageBuilder message;
    auto batch = message.initRoot<wire::AgentMessage>().initBatch();
    batch.setInstanceId(7);
    batch.setSeq(++seq);
    if (again)
      agent.announce(batch, DropCounts{}, "");
    else
      agent.fill(batch, DropCounts{});
    return send("gpu-1", proto::to_packed(message));
  };
  hello("gpu-1");
  ASSERT_TRUE(send_from_agent(false));
  uint64_t child = 0;
  for (const auto& [hash, c] : ingest->comms())
    if (c.split.color == 3) child = hash;
  ASSERT_NE(child, 0u);
  ASSERT_EQ(comm(child).split.sizing, SplitSizing::derived);
  EXPECT_EQ(*store->count(child, 0, 0), 3u);
  rs_async_error_event broke{};
  broke.hdr.pid = broke.hdr.tid = b;
  broke.hdr.kind = RS_EV_ASYNC_ERROR;
  broke.comm = 0x21;
  broke.async_error = 6;  // ncclRemoteError
  agent.on_event(broke);
  ASSERT_TRUE(send_from_agent(false));
  ASSERT_TRUE(comm(child).members.at(0).error.has_value());

  // The job's new collector: a database of its own.
  ingest.reset();
  commit.reset();
  store = std::move(TimelineStore::open(dir.file("new-owner")).value());
  commit = std::make_unique<testing::StoreCommit>(*store);
  ingest = std::make_unique<Ingest>(*store, *commit, clock);
  hello("gpu-1");
  EXPECT_TRUE(send_from_agent(true));
  calls(3, 5);
  EXPECT_TRUE(send_from_agent(false)) << "the child's records wait for a split nobody can size";
  EXPECT_EQ(comm(child).split.sizing, SplitSizing::derived);
  EXPECT_EQ(comm(child).nranks, 1);
  EXPECT_EQ(*store->count(child, 0, 0), 2u) << "its later records, under its own rank";
  ASSERT_TRUE(comm(child).members.at(0).error.has_value()) << "the error of a broken communicator, told again";
  EXPECT_EQ(comm(child).members.at(0).error->async_error, 6);
  EXPECT_EQ(ingest->node("gpu-1")->refused_claims, 0u);

  // Announced to a collector that knows it all (the job back with its
  // first owner): nothing refused, nothing changed.
  EXPECT_TRUE(send_from_agent(true));
  EXPECT_EQ(ingest->node("gpu-1")->refused_claims, 0u);
  EXPECT_EQ(comm(child).split.sizing, SplitSizing::derived);

  // Once the parent ends, its splits without a child are not announced again.
  rs_comm_end_event end{};
  end.hdr.pid = end.hdr.tid = a;
  end.hdr.kind = RS_EV_COMM_END;
  end.comm = 0x10;
  end.op = RS_OP_COMM_DESTROY;
  agent.on_event(end);
  capnp::MallocMessageBuilder message;
  auto again = message.initRoot<wire::AgentMessage>().initBatch();
  agent.announce(again, DropCounts{}, "");
  for (auto c : again.getComms()) EXPECT_NE(c.getPid(), a) << "pid " << c.getPid() << " handle " << c.getHandle();
}

}  // namespace
}  // namespace rankscope::collector
