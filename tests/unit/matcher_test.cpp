// The one collective matcher, fed records by hand (no store, no wire): what
// every consumer (the detectors, the usage ledger) hears of a collective.
#include <gtest/gtest.h>

#include <vector>

#include "collector/match/matcher.h"
#include "proto/records.h"

namespace rankscope::collector {
namespace {

struct Heard final : MatchListener {
  struct Complete {
    uint64_t seq;
    std::vector<uint64_t> issue;
  };
  std::vector<Complete> complete;
  std::vector<CollectiveMismatch> mismatches;
  struct Pair {
    int32_t sender, receiver;
    uint64_t send_ns, recv_ns;
  };
  std::vector<Pair> pairs;
  // Each on_issues call: its rank, lane and (seq, issue) pairs, and how
  // many completions had been heard before it.
  struct Issues {
    int32_t rank;
    uint32_t lane;
    std::vector<std::pair<uint64_t, uint64_t>> issues;
    size_t completed_before;
  };
  std::vector<Issues> issues;
  void on_issues(const CommState&, int32_t rank, uint32_t lane, std::span<const Issue> block) override {
    Issues heard{rank, lane, {}, complete.size()};
    for (const Issue& i : block) heard.issues.emplace_back(i.seq, i.issue_ns);
    issues.push_back(std::move(heard));
  }
  void on_complete(const CollectiveComplete& done) override { complete.push_back({done.seq, done.issue}); }
  void on_mismatch(const CollectiveMismatch& m) override { mismatches.push_back(m); }
  void on_pair(const PairComplete& p) override {
    pairs.push_back({p.sender, p.receiver, p.send_issue_ns, p.recv_issue_ns});
  }
};

CommState comm_of(uint64_t hash, int32_t nranks) {
  CommState comm;
  comm.hash = hash;
  comm.nranks = nranks;
  comm.job = "job-1";
  return comm;
}

proto::CallRecord call(uint64_t seq, uint64_t issue_ns, uint8_t op = RS_OP_ALLREDUCE, uint64_t count = 1024) {
  proto::CallRecord r;
  r.seq = seq;
  r.issue_ns = issue_ns;
  r.return_ns = issue_ns + 10;
  r.op = op;
  r.datatype = 7;
  r.count = count;
  return r;
}

TEST(CollectiveMatcher, ACollectiveCompletesOnceWithEveryMembersArrival) {
  CollectiveMatcher matcher;
  Heard heard;
  matcher.subscribe(heard);
  CommState comm = comm_of(0xc0, 4);
  for (int32_t rank : {2, 0, 3}) matcher.on_record(comm, rank, 0, call(5, 1000 + rank));
  matcher.on_record(comm, 0, 0, call(5, 9999));  // a re-sent record: the first arrival stands
  EXPECT_TRUE(heard.complete.empty()) << "rank 1 has not issued it";
  auto [seq, open] = matcher.open_from(0xc0, 0);
  ASSERT_NE(open, nullptr);
  EXPECT_EQ(seq, 5u);
  EXPECT_EQ(open->arrived, 3);
  EXPECT_EQ(open->first_issue_ns, 1000u);
  EXPECT_EQ(open->first.describe(), "AllReduce 1024 x float32 sum");

  matcher.on_record(comm, 1, 0, call(5, 1500));
  ASSERT_EQ(heard.complete.size(), 1u);
  EXPECT_EQ(heard.complete[0].seq, 5u);
  EXPECT_EQ(heard.complete[0].issue, (std::vector<uint64_t>{1000, 1500, 1002, 1003}));
  EXPECT_EQ(matcher.open_from(0xc0, 0).second, nullptr) << "a complete instance is not kept";
  EXPECT_EQ(matcher.open_bytes(), 0u);
  EXPECT_TRUE(heard.mismatches.empty());
}

TEST(CollectiveMatcher, ABlockIsToldAsOneCallOfItsExchangesThenMatchedRecordByRecord) {
  CollectiveMatcher matcher;
  Heard heard;
  matcher.subscribe(heard);
  CommState comm = comm_of(0xc5, 2);
  matcher.on_record(comm, 1, 0, call(0, 100));
  matcher.on_record(comm, 1, 0, call(1, 200));
  // Rank 0's block: two collectives with a call that is not one between them.
  const std::vector<proto::CallRecord> block = {call(0, 110), call(1, 0, RS_OP_SEND), call(1, 190)};
  matcher.on_records(comm, 0, 0, block);
  ASSERT_EQ(heard.issues.size(), 3u);
  EXPECT_EQ(heard.issues[2].rank, 0);
  EXPECT_EQ(heard.issues[2].issues, (std::vector<std::pair<uint64_t, uint64_t>>{{0, 110}, {1, 190}}))
      << "only the exchanges of its lane, in one call";
  EXPECT_EQ(heard.issues[2].completed_before, 0u) << "told before its records are matched";
  ASSERT_EQ(heard.complete.size(), 2u);
  EXPECT_EQ(heard.complete[0].issue, (std::vector<uint64_t>{110, 100}));
  EXPECT_EQ(heard.complete[1].issue, (std::vector<uint64_t>{190, 200}));

  // A block with no exchange of its lane is not told at all: an AllReduce
  // on a peer's lane, an empty block.
  matcher.on_records(comm, 0, 3, std::vector<proto::CallRecord>{call(2, 300)});
  matcher.on_records(comm, 0, 0, std::vector<proto::CallRecord>{});
  EXPECT_EQ(heard.issues.size(), 3u);
}

TEST(CollectiveMatcher, DifferentCallsAtOneSequenceNumberAreAMismatchNotACompletion) {
  CollectiveMatcher matcher;
  Heard heard;
  matcher.subscribe(heard);
  CommState comm = comm_of(0xc1, 3);
  matcher.on_record(comm, 0, 0, call(7, 100));
  matcher.on_record(comm, 1, 0, call(7, 101));
  matcher.on_record(comm, 2, 0, call(7, 102, RS_OP_ALLREDUCE, 2048));
  ASSERT_EQ(heard.mismatches.size(), 1u);
  EXPECT_EQ(heard.mismatches[0].seq, 7u);
  ASSERT_EQ(heard.mismatches[0].groups.size(), 2u);
  size_t ranks = 0;
  for (const auto& [shape, members] : heard.mismatches[0].groups) {
    ranks += members.size();
    if (shape.count == 2048) EXPECT_EQ(members, std::vector<int32_t>{2});
    else EXPECT_EQ(members, (std::vector<int32_t>{0, 1}));
  }
  EXPECT_EQ(ranks, 3u);
  EXPECT_TRUE(heard.complete.empty()) << "a mismatched collective never completes";
}

TEST(CollectiveMatcher, TheKthSendPairsWithTheKthRecvOfTheSameDirection) {
  CollectiveMatcher matcher;
  Heard heard;
  matcher.subscribe(heard);
  CommState comm = comm_of(0xc2, 2);
  // Lane 1 + 2 x peer (+1 for a Recv): rank 0 sends to 1 on lane 3, rank 1 receives from 0 on lane 2.
  matcher.on_record(comm, 0, 3, call(0, 500, RS_OP_SEND));
  matcher.on_record(comm, 0, 3, call(0, 500, RS_OP_SEND));  // the same side again
  EXPECT_TRUE(heard.pairs.empty());
  matcher.on_record(comm, 1, 2, call(0, 800, RS_OP_RECV));
  ASSERT_EQ(heard.pairs.size(), 1u);
  EXPECT_EQ(heard.pairs[0].sender, 0);
  EXPECT_EQ(heard.pairs[0].receiver, 1);
  EXPECT_EQ(heard.pairs[0].send_ns, 500u);
  EXPECT_EQ(heard.pairs[0].recv_ns, 800u);
  matcher.on_record(comm, 1, 4, call(1, 900, RS_OP_RECV));  // a peer outside the communicator
  EXPECT_EQ(heard.pairs.size(), 1u);
}

TEST(CollectiveMatcher, OpenInstancesAreBoundedAndForgottenWithTheirCommunicator) {
  CollectiveMatcher matcher;
  Heard heard;
  matcher.subscribe(heard);
  std::map<uint64_t, CommState> comms;
  comms[0xc3] = comm_of(0xc3, 65'536);
  comms[0xc4] = comm_of(0xc4, 2);
  for (uint64_t seq = 0; seq < 4096; ++seq) matcher.on_record(comms[0xc3], 0, 0, call(seq, 1000 + seq));
  EXPECT_LE(matcher.open_bytes(), OpenBudget::kDefaultPerCommBytes);
  EXPECT_GT(matcher.open_evicted(), 0u);
  uint64_t held = matcher.open_bytes();
  matcher.on_record(comms[0xc3], 70'000, 0, call(5000, 5));  // a rank outside the size is ignored
  EXPECT_EQ(matcher.open_bytes(), held);
  matcher.on_record(comms[0xc4], 0, 0, call(0, 10));
  comms[0xc3].ended = true;
  matcher.sweep(comms);
  EXPECT_EQ(matcher.open_from(0xc3, 0).second, nullptr);
  EXPECT_NE(matcher.open_from(0xc4, 0).second, nullptr) << "another communicator keeps its own";
  matcher.on_record(comms[0xc4], 1, 0, call(0, 12));
  EXPECT_EQ(heard.complete.size(), 1u);
  EXPECT_EQ(matcher.open_bytes(), 0u);
}

}  // namespace
}  // namespace rankscope::collector
