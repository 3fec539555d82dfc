// The detectors on synthetic timelines fed through the real ingest path
// (Cap'n Proto batches into a real RocksDB), with a clock the test drives.
#include <gtest/gtest.h>

#include <random>

#include "collector/detect/detector.h"
#include "tests/support/feed.h"
#include "tests/support/harness.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kComm = 0xfeedface12345678ull;
constexpr uint64_t kSecond = 1'000'000'000ull;
constexpr uint64_t kMs = 1'000'000ull;

class TestClock final : public Clock {
 public:
  uint64_t monotonic_ns() const override { return now; }
  uint64_t realtime_ns() const override { return now; }
  uint64_t now = 1'000 * kSecond;
};

struct Call {
  int32_t rank;
  uint64_t seq;
  uint64_t issue_ns;
  uint8_t op = RS_OP_ALLREDUCE;
  uint64_t count = 1024;
};

class DetectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options.hang_timeout_ns = 5 * kSecond;
    options.node_lost_timeout_ns = 10 * kSecond;
    detector = std::make_unique<Detector>(ingest, book, clock, options);
    ingest.add_observer(detector.get());
  }

  std::string node_of(int32_t rank) const { return "node-" + std::to_string(rank / 2); }

  void send(const std::string& node, const std::function<void(wire::AgentMessage::Builder)>& fill) {
    testing::feed(ingest, node, fill);
  }

  // Hello from every node, the communicator on every rank, and (if
  // `tight_clocks`) probes that make every clock exact to 100 ns.
  void start(int32_t nranks, bool tight_clocks = true, const std::set<int32_t>& unregistered = {}) {
    this->nranks = nranks;
    for (int32_t rank = 0; rank < nranks; rank += 2) {
      std::string node = node_of(rank);
      send(node, [&](auto m) {
        auto h = m.initHello();
        h.setProtocolVersion(wire::PROTOCOL_VERSION);
        h.setNode(node);
        h.setInstanceId(7);
      });
      send(node, [&](auto m) {
        auto b = m.initBatch();
        b.setInstanceId(7);
        b.setSeq(++batch_seq[node]);
        std::vector<int32_t> here;
        for (int32_t r = rank; r < std::min(rank + 2, nranks); ++r)
          if (!unregistered.count(r)) here.push_back(r);
        register_ranks(b, here);
        if (tight_clocks) {
          auto samples = b.initClockSamples(1);
          samples[0].setT1(1000);
          samples[0].setT2(1050);
          samples[0].setT3(1060);
          samples[0].setT4(1110);
        }
      });
    }
  }

  void register_ranks(wire::Batch::Builder b, const std::vector<int32_t>& ranks) {
    auto procs = b.initProcesses(static_cast<unsigned>(ranks.size()));
    auto comms = b.initComms(static_cast<unsigned>(ranks.size()));
    for (unsigned i = 0; i < ranks.size(); ++i) {
      procs[i].setPid(100 + ranks[i]);
      procs[i].setJob("job-1");
      procs[i].setLocalRank(ranks[i] % 2);
      procs[i].setVisibleDevices("4,5");
      procs[i].setUser("alice");
      procs[i].setAccount("physics");
      comms[i].setPid(100 + ranks[i]);
      comms[i].setCommHash(kComm);
      comms[i].setRank(ranks[i]);
      comms[i].setNranks(nranks);
    }
  }

  void register_late(int32_t rank) {
    send(node_of(rank), [&](auto m) {
      auto b = m.initBatch();
      b.setInstanceId(7);
      b.setSeq(++batch_seq[node_of(rank)]);
      register_ranks(b, {rank});
    });
  }

  void calls(const std::vector<Call>& list) {
    std::map<int32_t, proto::ColumnBlock> blocks;
    for (const Call& c : list) {
      auto& block = blocks[c.rank];
      block.pid = 100 + c.rank;
      block.comm_hash = kComm;
      block.rank = c.rank;
      proto::CallRecord r;
      r.seq = c.seq;
      r.issue_ns = c.issue_ns;
      r.return_ns = c.issue_ns + 5000;
      r.op = c.op;
      r.datatype = 7;
      r.count = c.count;
      block.records.push_back(r);
    }
    for (auto& [rank, block] : blocks) {
      send(node_of(rank), [&](auto m) {
        auto b = m.initBatch();
        b.setInstanceId(7);
        b.setSeq(++batch_seq[node_of(rank)]);
        proto::encode_collectives({&block}, b);
      });
    }
  }

  // One collective per rank at `seq`, issued at `t` plus a per-rank delay.
  void instance(uint64_t seq, uint64_t t, const std::function<int64_t(int32_t)>& delay = nullptr,
                const std::set<int32_t>& absent = {}) {
    std::vector<Call> list;
    for (int32_t r = 0; r < nranks; ++r)
      if (!absent.count(r)) list.push_back({r, seq, t + (delay ? delay(r) : 0)});
    calls(list);
  }

  // A heartbeat of `rank`'s node reporting that process only.
  void health(int32_t rank, char state, uint64_t cpu_ns, uint64_t sample_ns) {
    node_health({rank}, state, cpu_ns, sample_ns, 0);
  }

  // One heartbeat of the node of `ranks` (all on one node), as an agent sends
  // it: every process's health and every wait in progress; `waiting_since` >
  // 0: each is blocked in cudaStreamSynchronize since then (node clock).
  void node_health(const std::vector<int32_t>& ranks, char state, uint64_t cpu_ns, uint64_t sample_ns,
                   uint64_t waiting_since) {
    send(node_of(ranks.front()), [&](auto m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      auto p = hb.initProcesses(static_cast<unsigned>(ranks.size()));
      auto w = hb.initOpenWaits(waiting_since ? static_cast<unsigned>(ranks.size()) : 0);
      for (unsigned i = 0; i < ranks.size(); ++i) {
        p[i].setPid(100 + ranks[i]);
        p[i].setAlive(true);
        p[i].setState(static_cast<uint8_t>(state));
        p[i].setCpuNs(cpu_ns);
        p[i].setSampleNs(sample_ns);
        if (!waiting_since) continue;
        w[i].setPid(100 + ranks[i]);
        w[i].setKind(wire::WaitKind::STREAM_SYNCHRONIZE);
        w[i].setStartNs(waiting_since);
      }
    });
  }

  void evaluate_at(uint64_t t) {
    clock.now = t;
    detector->evaluate(t);
  }

  std::vector<const Finding*> open(FindingKind kind) {
    std::vector<const Finding*> out;
    for (const Finding* f : book.open())
      if (f->kind == kind) out.push_back(f);
    return out;
  }

  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  TestClock clock;
  Ingest ingest{*store, clock};
  FindingBook book;
  DetectOptions options;
  std::unique_ptr<Detector> detector;
  std::map<std::string, uint64_t> batch_seq;
  int32_t nranks = 0;
};

TEST_F(DetectTest, HangNamesTheRankThatNeverEnteredAndResolvesWhenItDoes) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * 10 * kMs);
  instance(10, t + 100 * kMs, nullptr, {3});  // rank 3 never enters #10

  evaluate_at(t + 100 * kMs + options.hang_timeout_ns - kSecond);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "not before the timeout";

  evaluate_at(t + 100 * kMs + options.hang_timeout_ns + kMs);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
  EXPECT_EQ(hangs[0]->seq, 10);
  EXPECT_EQ(hangs[0]->nodes, std::vector<std::string>{"node-1"});
  EXPECT_EQ(hangs[0]->job, "job-1");
  EXPECT_NE(hangs[0]->summary.find("never entered AllReduce #10"), std::string::npos) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->detail.find("pid 103, GPU 5, user alice, account physics"), std::string::npos)
      << hangs[0]->detail;

  calls({{3, 10, clock.now}});
  evaluate_at(clock.now + kMs);
  EXPECT_TRUE(open(FindingKind::hang).empty());
}

TEST_F(DetectTest, EveryRankInsideAndIdleIsReportedAsNoRankMissing) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 5; ++seq) instance(seq, t + seq * kMs);
  for (int32_t node = 0; node < 2; ++node) {  // alive, asleep in cudaStreamSynchronize, no CPU used
    node_health({2 * node, 2 * node + 1}, 'S', 1000, t, t + 5 * kMs);
    node_health({2 * node, 2 * node + 1}, 'S', 1000, t + 6 * kSecond, t + 5 * kMs);
  }
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks.size(), 4u);
  EXPECT_NE(hangs[0]->summary.find("no rank is missing"), std::string::npos) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->summary.find("every rank blocked in a CUDA wait"), std::string::npos) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->detail.find("blocked in cudaStreamSynchronize since"), std::string::npos) << hangs[0]->detail;
}

TEST_F(DetectTest, StoppedProcessInsideTheCollectiveIsTheCulprit) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 5; ++seq) instance(seq, t + seq * kMs);
  for (int32_t r = 0; r < 4; ++r) health(r, r == 2 ? 'T' : 'S', 1000, t);
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{2});
  EXPECT_NE(hangs[0]->detail.find("stopped"), std::string::npos);
}

TEST_F(DetectTest, BusyRanksWithoutCollectivesAreNotAHang) {
  start(2);
  uint64_t t = clock.now;
  instance(0, t);
  for (int32_t r = 0; r < 2; ++r) {  // computing (a long evaluation step): 100% CPU
    health(r, 'R', 0, t);
    health(r, 'R', 6 * kSecond, t + 6 * kSecond);
  }
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  EXPECT_TRUE(open(FindingKind::hang).empty());
}

TEST_F(DetectTest, MismatchIsReportedAsSoonAsBothCallsAreKnown) {
  start(4);
  uint64_t t = clock.now;
  instance(0, t);
  calls({{0, 1, t + kMs}, {1, 1, t + kMs}, {2, 1, t + kMs, RS_OP_ALLGATHER}, {3, 1, t + kMs}});
  auto mismatches = open(FindingKind::mismatch);
  ASSERT_EQ(mismatches.size(), 1u) << "no evaluation needed";
  EXPECT_EQ(mismatches[0]->ranks, std::vector<int32_t>{2});
  EXPECT_EQ(mismatches[0]->seq, 1);
  EXPECT_NE(mismatches[0]->summary.find("AllGather"), std::string::npos) << mismatches[0]->summary;

  calls({{0, 2, t + 2 * kMs, RS_OP_ALLREDUCE, 1024}, {1, 2, t + 2 * kMs, RS_OP_ALLREDUCE, 2048}});
  auto sizes = open(FindingKind::mismatch);
  ASSERT_EQ(sizes.size(), 2u) << "a different byte count at the same sequence is a mismatch too";
}

TEST_F(DetectTest, PersistentlyLateRankIsAStragglerAndRecovers) {
  start(4);
  uint64_t t = clock.now;
  uint64_t seq = 0;
  auto step = [&](int64_t late) {
    instance(seq, t + seq * 20 * kMs, [&](int32_t r) { return (r == 1 ? late : 0) + (r * 37 + seq * 11) % 300 * 1000; });
    ++seq;
  };
  for (int i = 0; i < 40; ++i) step(10 * kMs);
  for (int i = 0; i < options.open_after; ++i) evaluate_at(t + seq * 20 * kMs + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001);
  EXPECT_GT(stragglers[0]->wait_share, 0.2);
  EXPECT_GT(stragglers[0]->gpu_hours_lost, 0.0);

  for (int i = 0; i < 40; ++i) step(0);
  for (int i = 0; i < options.close_after; ++i) evaluate_at(t + seq * 20 * kMs + i * kMs);
  EXPECT_TRUE(open(FindingKind::straggler).empty());
}

TEST_F(DetectTest, RandomJitterIsNotAStraggler) {
  start(8);
  std::mt19937 rng(3);
  std::normal_distribution<double> jitter(0, 1.5e6);  // 1.5 ms
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 200; ++seq) {
    instance(seq, t + seq * 20 * kMs, [&](int32_t) { return static_cast<int64_t>(std::abs(jitter(rng))); });
    if (seq % 10 == 0) evaluate_at(t + seq * 20 * kMs);
  }
  EXPECT_TRUE(book.open().empty());
}

TEST_F(DetectTest, LatenessWithinClockUncertaintyIsNotFlagged) {
  start(2, /*tight_clocks=*/false);  // only the Hello's wall clock: 1 s uncertain
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 40; ++seq) instance(seq, t + seq * 50 * kMs, [](int32_t r) { return r == 1 ? 20 * kMs : 0; });
  for (int i = 0; i < 6; ++i) evaluate_at(t + 3 * kSecond + i * kMs);
  EXPECT_TRUE(open(FindingKind::straggler).empty());
}

TEST_F(DetectTest, RankThatJoinsLateButCatchesUpIsNotAHang) {
  start(4, true, {3});
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 4; ++seq) instance(seq, t + seq * kMs, nullptr, {3});
  clock.now = t + 2 * kSecond;
  register_late(3);
  for (uint64_t seq = 0; seq < 4; ++seq) calls({{3, seq, clock.now + seq * kMs}});
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  EXPECT_TRUE(book.open().empty());
}

TEST_F(DetectTest, RankThatNeverJoinedIsNamed) {
  start(4, true, {3});
  // Rank 3's registration and calls never came; the others are at #3.
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 4; ++seq) instance(seq, t + seq * kMs, nullptr, {3});
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
  EXPECT_EQ(hangs[0]->seq, 0);
}

TEST_F(DetectTest, DestroyedCommunicatorResolvesItsFindings) {
  start(2);
  uint64_t t = clock.now;
  instance(0, t);
  calls({{0, 1, t + kMs}});
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  ASSERT_EQ(open(FindingKind::hang).size(), 1u);
  send(node_of(0), [&](auto m) {
    auto b = m.initBatch();
    b.setInstanceId(7);
    b.setSeq(++batch_seq[node_of(0)]);
    auto ends = b.initCommEnds(1);
    ends[0].setPid(100);
    ends[0].setCommHash(kComm);
  });
  evaluate_at(clock.now + kMs);
  EXPECT_TRUE(book.open().empty());
}

TEST_F(DetectTest, SequenceGapFromADropIsNotAHang) {
  start(2);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * kMs, nullptr, seq == 5 ? std::set<int32_t>{1} : std::set<int32_t>{});
  // Rank 1's record #5 was lost to a full ring buffer; the job goes on.
  for (uint64_t seq = 10; seq < 20; ++seq) instance(seq, t + options.hang_timeout_ns + seq * kMs);
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  EXPECT_TRUE(book.open().empty());
}

TEST_F(DetectTest, SilentNodeWithLiveRanksIsLost) {
  start(4);
  instance(0, clock.now);
  evaluate_at(clock.now + options.node_lost_timeout_ns / 2);
  EXPECT_TRUE(open(FindingKind::node_lost).empty());
  health(0, 'S', 0, 0);  // node-0 keeps talking, node-1 does not
  evaluate_at(clock.now + options.node_lost_timeout_ns / 2 + kSecond);
  auto lost = open(FindingKind::node_lost);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0]->nodes, std::vector<std::string>{"node-1"});
  EXPECT_EQ(lost[0]->ranks, (std::vector<int32_t>{2, 3}));
  health(2, 'S', 0, 0);
  evaluate_at(clock.now + kMs);
  EXPECT_TRUE(open(FindingKind::node_lost).empty());
}

TEST_F(DetectTest, FindingsSurviveACollectorRestart) {
  start(4);
  uint64_t t = clock.now;
  instance(0, t);
  instance(1, t + kMs, nullptr, {3});
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  ASSERT_EQ(open(FindingKind::hang).size(), 1u);
  const Finding before = *open(FindingKind::hang)[0];
  book.persist(ingest.pending_writes());
  ASSERT_TRUE(ingest.commit());

  // A new collector on the same database: the same open finding, same id,
  // and it still resolves on its own.
  FindingBook restarted;
  ASSERT_TRUE(restarted.restore(*store));
  auto open_after = restarted.open();
  ASSERT_EQ(open_after.size(), 1u);
  EXPECT_EQ(open_after[0]->id, before.id);
  EXPECT_EQ(open_after[0]->ranks, before.ranks);
  EXPECT_EQ(open_after[0]->detail, before.detail);
  EXPECT_EQ(open_after[0]->opened_ns, before.opened_ns);
  Ingest ingest_after(*store, clock);
  ASSERT_TRUE(ingest_after.restore());
  Detector detector_after(ingest_after, restarted, clock, options);
  ingest_after.add_observer(&detector_after);
  Finding next;
  next.kind = FindingKind::hang;
  next.comm = kComm;
  next.seq = 99;
  EXPECT_GT(restarted.raise(next, clock.now).id, before.id) << "ids keep increasing after a restart";
}

}  // namespace
}  // namespace rankscope::collector
