// The detectors on synthetic timelines fed through the real ingest path
// (Cap'n Proto batches into a real RocksDB), with a clock the test drives.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <tuple>

#include "collector/detect/detector.h"
#include "collector/detect/finding_store.h"
#include "collector/detect/host_wait.h"
#include "collector/query.h"
#include "tests/support/feed.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"
#include "tests/support/store_commit.h"
#include "tests/support/wire.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kComm = 0xfeedface12345678ull;
constexpr uint64_t kSecond = 1'000'000'000ull;
constexpr uint64_t kMs = 1'000'000ull;
constexpr int kTicks = 3;  // evaluations after the last step

using TestClock = testing::ManualClock;

struct Call {
  int32_t rank;  // the process: pid 100 + rank on node_of(rank)
  uint64_t seq;
  uint64_t issue_ns;
  uint8_t op = RS_OP_ALLREDUCE;
  uint64_t count = 1024;
  uint64_t comm = kComm;
  int32_t comm_rank = -1;  // -1: the same as rank
  uint32_t lane = 0;
};

class DetectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options.hang_timeout_ns = 5 * kSecond;
    options.node_lost_timeout_ns = 10 * kSecond;
    ingest.add_observer(&matcher);
    detector = std::make_unique<Detector>(ingest.model(), matcher, book, clock, options);
    ingest.add_observer(detector.get());  // host waits, as collector/service.cpp
  }

  std::string node_of(int32_t rank) const { return "node-" + std::to_string(rank / 2); }

  void send(const std::string& node, const std::function<void(wire::AgentMessage::Builder)>& fill) {
    testing::feed(ingest, commit, node, fill);
  }
  void send(const std::string& node, const std::string& bytes) { testing::feed(ingest, commit, node, bytes); }

  // Hello from every node, the communicator on every rank, and (if
  // `tight_clocks`) probes that make every clock exact to 100 ns.
  void start(int32_t nranks, bool tight_clocks = true, const std::set<int32_t>& unregistered = {}) {
    this->nranks = nranks;
    for (int32_t rank = 0; rank < nranks; rank += 2) {
      std::string node = node_of(rank);
      send(node, testing::hello_message(node, 7));
      std::vector<int32_t> here;
      for (int32_t r = rank; r < std::min(rank + 2, nranks); ++r)
        if (!unregistered.count(r)) here.push_back(r);
      testing::AgentBatch b = batch(node);
      register_ranks(b, here);
      if (tight_clocks) b.clock_samples = {testing::tight_clock_sample()};
      send(node, b.bytes());
    }
  }

  // The node's agent's next batch.
  testing::AgentBatch batch(const std::string& node) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++batch_seq[node];
    return b;
  }

  void register_ranks(testing::AgentBatch& b, const std::vector<int32_t>& ranks) {
    for (int32_t rank : ranks) {
      proto::ProcessIdentity p = testing::process(100 + rank, "job-1", "physics", "alice");
      p.local_rank = rank % 2;
      p.visible_devices = "4,5";
      b.processes.push_back(p);
      b.comms.push_back(testing::member(100 + rank, kComm, rank, nranks));
    }
  }

  void register_late(int32_t rank) {
    testing::AgentBatch b = batch(node_of(rank));
    register_ranks(b, {rank});
    send(node_of(rank), b.bytes());
  }

  // Every member of kComm in `ranks` ends it (ncclCommDestroy).
  void end_comm(const std::vector<int32_t>& ranks) {
    for (int32_t rank : ranks) {
      testing::AgentBatch b = batch(node_of(rank));
      b.comm_ends.emplace_back(100 + rank, kComm);
      send(node_of(rank), b.bytes());
    }
  }

  // Another communicator over the processes `members` (by comm rank), on their nodes.
  void register_comm(uint64_t hash, const std::vector<int32_t>& members) {
    std::map<std::string, std::vector<std::pair<int32_t, int32_t>>> by_node;  // node -> (process, comm rank)
    for (size_t i = 0; i < members.size(); ++i)
      by_node[node_of(members[i])].emplace_back(members[i], static_cast<int32_t>(i));
    for (const auto& [node, list] : by_node) {
      testing::AgentBatch b = batch(node);
      for (const auto& [process, rank] : list)
        b.comms.push_back(testing::member(100 + process, hash, rank, static_cast<int32_t>(members.size())));
      send(node, b.bytes());
    }
  }

  // Adds the call to its (process, communicator, lane) block.
  static void add_call(proto::ColumnBlock& block, const Call& c) {
    block.pid = 100 + c.rank;
    block.comm_hash = c.comm;
    block.rank = c.comm_rank < 0 ? c.rank : c.comm_rank;
    block.lane = c.lane;
    proto::CallRecord r;
    r.seq = c.seq;
    r.issue_ns = c.issue_ns;
    r.return_ns = c.issue_ns + 5000;
    r.op = c.op;
    r.datatype = 7;
    r.count = c.count;
    if (c.lane > 0) r.peer = static_cast<int32_t>((c.lane - 1) / 2);
    block.records.push_back(r);
  }

  void calls(const std::vector<Call>& list) {
    std::map<std::tuple<int32_t, uint64_t, uint32_t>, proto::ColumnBlock> blocks;
    for (const Call& c : list) add_call(blocks[{c.rank, c.comm, c.lane}], c);
    for (auto& [where, block] : blocks) {
      int32_t rank = std::get<0>(where);
      testing::AgentBatch b = batch(node_of(rank));
      b.calls.push_back(std::move(block));
      send(node_of(rank), b.bytes());
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

  // Only the Hello's wall clock (1 s uncertain): rank `late` on time for a
  // window and a bucket, then 20 ms late at every instance for as long, over
  // the floor and under the clocks' uncertainty against another node.
  std::vector<const Finding*> late_under_loose_clocks(int32_t nranks, int32_t late) {
    start(nranks, /*tight_clocks=*/false);
    const uint64_t t = clock.now;
    const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (50 * kMs);
    uint64_t seq = 0;
    for (; seq < 2 * window_steps; ++seq)
      instance(seq, t + seq * 50 * kMs, [&](int32_t r) { return r == late && seq >= window_steps ? 20 * kMs : 0; });
    for (int i = 0; i < kTicks; ++i) evaluate_at(t + seq * 50 * kMs + options.settle_ns + i * kMs);
    return open(FindingKind::straggler);
  }

  // `rank`'s host waited on its stream (cudaStreamSynchronize) from `start` to `end`.
  void host_wait(int32_t rank, uint64_t start, uint64_t end) {
    testing::AgentBatch b = batch(node_of(rank));
    proto::WaitBlock block;
    block.pid = 100 + rank;
    block.tid = 100 + rank;
    block.waits.push_back({static_cast<uint8_t>(wire::WaitKind::STREAM_SYNCHRONIZE), 0x5, start, end, 0});
    b.waits.push_back(block);
    send(node_of(rank), b.bytes());
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

  // A heartbeat of the node of `ranks`, as above (blocked in a CUDA wait
  // since `waiting_since`), whose processes' GPUs are inside collective
  // `seq` of kComm: every kernel started at `started`; `steps`: NCCL's proxy
  // steps were on when it was enqueued; `held`: rank -> (peer, since) of
  // its send step handed to the network and not done.
  void node_gpu(const std::vector<int32_t>& ranks, uint64_t sample_ns, uint64_t waiting_since, uint64_t seq,
                uint64_t started, const std::set<int32_t>& detail, const std::set<int32_t>& steps,
                const std::map<int32_t, std::pair<int32_t, uint64_t>>& held) {
    send(node_of(ranks.front()), [&](auto m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      const auto n = static_cast<unsigned>(ranks.size());
      auto p = hb.initProcesses(n);
      auto w = hb.initOpenWaits(n);
      auto g = hb.initGpuOpen(n);
      for (unsigned i = 0; i < n; ++i) {
        const uint32_t pid = 100 + static_cast<uint32_t>(ranks[i]);
        p[i].setPid(pid);
        p[i].setAlive(true);
        p[i].setState('S');
        p[i].setCpuNs(1000);
        p[i].setSampleNs(sample_ns);
        w[i].setPid(pid);
        w[i].setKind(wire::WaitKind::STREAM_SYNCHRONIZE);
        w[i].setStartNs(waiting_since);
        g[i].setPid(pid);
        g[i].setCommHash(kComm);
        g[i].setRank(ranks[i]);
        g[i].setOp(RS_OP_ALLREDUCE);
        g[i].setSeq(seq);
        g[i].setEnqueuedNs(started - kMs);
        g[i].setKernelStartNs(started);
        g[i].setDetail(detail.count(ranks[i]) > 0);
        g[i].setProxySteps(steps.count(ranks[i]) > 0);
        if (auto h = held.find(ranks[i]); h != held.end()) {
          g[i].setSendPeer(h->second.first);
          g[i].setSendSinceNs(h->second.second);
        }
      }
    });
  }

  // Every node's agent talks at `at` (an empty heartbeat), as live agents do
  // once a second: their ranks are seen, not lost.
  void keep_talking(uint64_t at) {
    clock.now = at;
    for (int32_t rank = 0; rank < nranks; rank += 2)
      send(node_of(rank), [](auto m) { m.initHeartbeat().setInstanceId(7); });
  }

  void evaluate_at(uint64_t t) {
    clock.now = t;
    detector->evaluate(t);
  }

  static std::string summaries(const std::vector<const Finding*>& findings) {
    std::string out;
    for (const Finding* f : findings) out += f->summary + "\n";
    return out;
  }

  std::vector<const Finding*> open(FindingKind kind) {
    std::vector<const Finding*> out;
    for (const Finding* f : book.open())
      if (f->kind == kind) out.push_back(f);
    return out;
  }

  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  TestClock clock{1'000 * kSecond};
  testing::StoreCommit commit{*store};
  Ingest ingest{*store, commit, clock};
  CollectiveMatcher matcher;
  FindingBook book;
  DetectOptions options;
  std::unique_ptr<Detector> detector;
  std::map<std::string, uint64_t> batch_seq;
  int32_t nranks = 0;
};

// A job whose processes all exited: once its communicator retires from the
// live model, the detector keeps nothing of it, and its open findings close.
TEST_F(DetectTest, ARetiredCommunicatorLeavesNothingInTheDetector) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * 10 * kMs);
  instance(10, t + 100 * kMs, nullptr, {3});
  keep_talking(t + 100 * kMs + options.hang_timeout_ns + kMs);
  evaluate_at(clock.now);
  ASSERT_EQ(open(FindingKind::hang).size(), 1u);
  EXPECT_EQ(detector->tracked_comms(), 1u);
  EXPECT_EQ(detector->tracked_processes(), 4u);
  node_health({0, 1}, 'S', 1000, 1000, 0);
  node_health({2, 3}, 'S', 1000, 1000, 0);
  EXPECT_EQ(ingest.retire(clock.now + kSecond, kSecond), 0u) << "retired while its processes live";

  for (int32_t rank = 0; rank < nranks; ++rank)
    send(node_of(rank), [&](auto m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      auto p = hb.initProcesses(1);
      p[0].setPid(100 + rank);
      p[0].setAlive(false);
      p[0].setState('X');
    });
  EXPECT_EQ(ingest.retire(clock.now + kSecond, kSecond), 1u);
  evaluate_at(clock.now + kSecond);
  EXPECT_EQ(detector->tracked_comms(), 0u);
  EXPECT_EQ(detector->tracked_processes(), 0u);
  EXPECT_TRUE(open(FindingKind::hang).empty());
}

TEST_F(DetectTest, HangNamesTheRankThatNeverEnteredAndResolvesWhenItDoes) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * 10 * kMs);
  instance(10, t + 100 * kMs, nullptr, {3});  // rank 3 never enters #10

  evaluate_at(t + 100 * kMs + options.hang_timeout_ns - kSecond);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "not before the timeout";

  keep_talking(t + 100 * kMs + options.hang_timeout_ns + kMs);
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

// A collector behind (its input queued, or reading the agents' spools after
// a restart) has not read yet what the missing rank's node sent since: the
// rank is missing only once that node told what it captured past the
// timeout, by a batch closed then or a heartbeat with every batch acknowledged.
TEST_F(DetectTest, AHangIsJudgedOnWhatTheMissingRanksNodeSentNotOnWhatIsOnItsWay) {
  start(4);
  const uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * 10 * kMs);
  instance(10, t + 100 * kMs, nullptr, {3});  // rank 3's #10 is not here
  testing::AgentBatch upto = batch("node-1");
  upto.created_ns = t + kSecond;  // node-1's batches closed after this one are still on their way
  send("node-1", upto.bytes());
  auto heartbeat = [&](uint64_t monotonic_ns, uint32_t unacked) {
    send("node-1", [&](auto m) {
      auto h = m.initHeartbeat();
      h.setInstanceId(7);
      h.setMonotonicNs(monotonic_ns);
      h.setUnackedBatches(unacked);
    });
  };

  const uint64_t due = t + 100 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  evaluate_at(due);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "node-1 told what it captured until t + 1 s only";
  heartbeat(due, 3);
  evaluate_at(due + kMs);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "a heartbeat with batches unacknowledged says nothing of them";

  heartbeat(due, 0);
  evaluate_at(due + 2 * kMs);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
  EXPECT_EQ(hangs[0]->seq, 10);
}

TEST_F(DetectTest, ANodeWhoseDataStaysBehindHoldsAHangBackOneMoreTimeoutAtMost) {
  start(4);
  const uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * 10 * kMs);
  instance(10, t + 100 * kMs, nullptr, {3});
  testing::AgentBatch upto = batch("node-1");
  upto.created_ns = t + kSecond;
  send("node-1", upto.bytes());

  // First held back two timeouts after the stall began (a collector far
  // behind, or a restarted one reading old spools): one more timeout on the
  // collector's clock from then, not from the records' times.
  const uint64_t held = t + 100 * kMs + 2 * options.hang_timeout_ns + kMs;
  keep_talking(held);
  evaluate_at(held);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "records two timeouts old are not judged at once";
  keep_talking(held + options.hang_timeout_ns - kSecond);
  evaluate_at(held + options.hang_timeout_ns - kSecond);
  EXPECT_TRUE(open(FindingKind::hang).empty());
  keep_talking(held + options.hang_timeout_ns + kMs);
  evaluate_at(held + options.hang_timeout_ns + kMs);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << "its batches are refused or held back: judged on what is here";
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
}

TEST_F(DetectTest, EveryRankInsideAndIdleIsReportedAsNoRankMissing) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 5; ++seq) instance(seq, t + seq * kMs);
  clock.now = t + 6 * kSecond;  // the agents report now
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

// Every rank inside, every GPU's kernels started and none finishes: NCCL's
// proxy steps (on when the collective was enqueued) show rank 2's data for
// rank 1 handed to the network and never done (and rank 0's for rank 3,
// handed over later). The hang names that link; with proxy steps and no
// data held, it says to suspect a GPU; with none, that no link can be named.
class DetectGpuInsideTest : public DetectTest {
 protected:
  const std::set<int32_t> all{0, 1, 2, 3};
  // `detail`: ranks whose collective was enqueued with proxy steps on;
  // `steps`: ranks whose proxy steps came; `held`: rank -> (peer, handed
  // over this long after the kernels started).
  const Finding* hang_with(const std::set<int32_t>& detail, const std::set<int32_t>& steps,
                           const std::map<int32_t, std::pair<int32_t, uint64_t>>& held) {
    start(4);
    uint64_t t = clock.now;
    for (uint64_t seq = 0; seq < 5; ++seq) instance(seq, t + seq * kMs);
    clock.now = t + 6 * kSecond;  // the agents report now
    std::map<int32_t, std::pair<int32_t, uint64_t>> since;
    for (const auto& [rank, h] : held) since[rank] = {h.first, t + 5 * kMs + h.second};
    for (int32_t node = 0; node < 2; ++node)
      node_gpu({2 * node, 2 * node + 1}, t + 6 * kSecond, t + 5 * kMs, 4, t + 5 * kMs, detail, steps, since);
    evaluate_at(t + options.hang_timeout_ns + kSecond);
    auto hangs = open(FindingKind::hang);
    EXPECT_EQ(hangs.size(), 1u);
    return hangs.empty() ? nullptr : hangs[0];
  }
};

TEST_F(DetectGpuInsideTest, OneSendHeldByTheNetworkNamesTheLink) {
  const Finding* f = hang_with(all, all, {{2, {1, kMs}}, {0, {3, 50 * kMs}}});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->ranks, (std::vector<int32_t>{2, 1})) << f->summary;
  EXPECT_NE(f->summary.find("rank 2 on node-1 handed its data for rank 1 on node-0 to the network"), std::string::npos)
      << f->summary;
  EXPECT_NE(f->summary.find("the link 2 -> 1 stopped moving"), std::string::npos) << f->summary;
  EXPECT_NE(f->summary.find("every process is alive"), std::string::npos) << f->summary;
}

TEST_F(DetectGpuInsideTest, ProxyStepsWithNoSendHeldSuspectAGpu) {
  const Finding* f = hang_with(all, all, {});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->ranks.size(), 4u);
  EXPECT_NE(f->summary.find("NCCL's proxy steps show no data held by the network: suspect a GPU inside"),
            std::string::npos)
      << f->summary;
}

// Ranks 1 and 3 reach their peers inside their node (NVLink): NCCL's proxy
// steps were asked for them too, but none reports. The hang names them and
// keeps a link the steps do not show a suspect.
TEST_F(DetectGpuInsideTest, RanksThatReportNoNetworkStepAreNamedAndTheirLinksStaySuspects) {
  const Finding* f = hang_with(all, {0, 2}, {});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->ranks.size(), 4u);
  EXPECT_NE(f->summary.find("show no data held by the network on the other ranks; ranks 1,3 reported no network "
                            "step of it (every peer on their node"),
            std::string::npos)
      << f->summary;
  EXPECT_NE(f->summary.find("suspect a GPU, or a link those steps do not show (inside a node: NVLink, PCIe)"),
            std::string::npos)
      << f->summary;
}

// A send handed to the network after the collective stalled is too recent
// to call its link stopped; the hang does not say that no data is held.
TEST_F(DetectGpuInsideTest, ASendHeldOnlyBrieflyIsNotCalledAStoppedLink) {
  const Finding* f = hang_with(all, all, {{2, {1, options.hang_timeout_ns * 3 / 4}}});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->ranks.size(), 4u) << f->summary;
  EXPECT_NE(f->summary.find("the network has held rank 2's data for rank 1 only since"), std::string::npos)
      << f->summary;
  EXPECT_EQ(f->summary.find("stopped moving"), std::string::npos) << f->summary;
  EXPECT_EQ(f->summary.find("no data held"), std::string::npos) << f->summary;
  EXPECT_NE(f->summary.find(": suspect the network (a link) or a GPU"), std::string::npos) << f->summary;
}

TEST_F(DetectGpuInsideTest, WithoutProxyStepsNoLinkIsNamed) {
  const Finding* f = hang_with({}, {}, {});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->ranks.size(), 4u);
  EXPECT_NE(f->summary.find("NCCL's proxy steps were not on when it was enqueued, so no link can be named"),
            std::string::npos)
      << f->summary;
}

TEST_F(DetectGpuInsideTest, ProxyStepsOffOnSomeRanksAreNamed) {
  const Finding* f = hang_with({0, 1}, {0, 1}, {});
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->summary.find("were not on when it was enqueued on ranks 2,3, so no link of theirs can be named"),
            std::string::npos)
      << f->summary;
  EXPECT_NE(f->summary.find("show no data held by the network on the other ranks"), std::string::npos) << f->summary;
}

// A send held briefly on one rank is said beside proxy steps off on others.
TEST_F(DetectGpuInsideTest, ABriefHoldIsSaidBesideRanksWithProxyStepsOff) {
  const Finding* f = hang_with({0, 1, 2}, {0, 1, 2}, {{2, {1, options.hang_timeout_ns * 3 / 4}}});
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->summary.find("the network has held rank 2's data for rank 1 only since"), std::string::npos)
      << f->summary;
  EXPECT_NE(f->summary.find("were not on when it was enqueued on rank 3,"), std::string::npos) << f->summary;
}

TEST_F(DetectTest, StoppedProcessInsideTheCollectiveIsTheCulprit) {
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 5; ++seq) instance(seq, t + seq * kMs);
  clock.now = t + options.hang_timeout_ns + kSecond;  // the agents report now
  for (int32_t r = 0; r < 4; ++r) health(r, r == 2 ? 'T' : 'S', 1000, t);
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{2});
  EXPECT_NE(hangs[0]->detail.find("stopped"), std::string::npos);
}

TEST_F(DetectTest, OfTheMissingRanksTheStoppedOneIsTheCulprit) {
  // Rank 2 is stopped right after issuing #9: ranks 1 and 3 are blocked
  // inside #9 waiting for its data (invisible to host tracing), rank 0 got
  // through and entered #10. Three ranks never entered #10; one holds it up.
  start(4);
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t + seq * 10 * kMs);
  instance(10, t + 100 * kMs, nullptr, {1, 2, 3});
  uint64_t due = t + 100 * kMs + options.hang_timeout_ns + kMs;
  clock.now = due;
  for (int32_t r = 0; r < 4; ++r) health(r, r == 2 ? 'T' : 'S', 1000, due);
  keep_talking(due);
  evaluate_at(due);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{2}) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->summary.find("rank 2 never entered AllReduce #10 and cannot progress"), std::string::npos)
      << hangs[0]->summary;
  EXPECT_NE(hangs[0]->summary.find("ranks 1,3 never entered it either (alive)"), std::string::npos)
      << hangs[0]->summary;
  EXPECT_NE(hangs[0]->detail.find("Also missing, alive:\n  rank 1 on node node-0"), std::string::npos)
      << hangs[0]->detail;
}

TEST_F(DetectTest, OneStoppedRankIsOneHangWithTheJobsOtherStallsFoldedIntoIt) {
  // 8 processes, tensor-parallel pairs {0,1} {2,3} {4,5} {6,7} and
  // data-parallel groups {0,2,4,6} {1,3,5,7}; each step a TP AllReduce, then
  // a DP AllReduce. Process 6 stops after step 4. Its pair partner (7) waits
  // in TP #5; the other pairs finish TP #5 and wait in DP #5, one group for
  // process 6 itself, the other for process 7, which waits for 6. Six
  // communicators stall; one rank holds them all.
  start(8);
  const uint64_t tp = kComm + 1, dp = kComm + 10;
  for (int32_t i = 0; i < 4; ++i) register_comm(tp + i, {2 * i, 2 * i + 1});
  for (int32_t g = 0; g < 2; ++g) register_comm(dp + g, {g, g + 2, g + 4, g + 6});
  uint64_t t = clock.now;
  const uint64_t stopped_after = 4;
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 8; ++r) {
      if (r == 6 && step > stopped_after) continue;
      list.push_back({r, step, t + step * 20 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, tp + r / 2, r % 2});
    }
    for (int32_t r = 0; r < 8; ++r) {
      if (r >= 6 && step > stopped_after) continue;  // 6 stopped; 7 waits in TP for it
      list.push_back({r, step, t + step * 20 * kMs + 10 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, dp + r % 2, r / 2});
    }
    calls(list);
  }
  uint64_t due = t + 5 * 20 * kMs + 10 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  health(6, 'T', 1000, due);
  evaluate_at(due);

  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  const Finding& hang = *hangs[0];
  const CommState& comm = ingest.comms().at(hang.comm);
  ASSERT_EQ(hang.ranks.size(), 1u) << hang.summary;
  EXPECT_EQ(comm.members.at(hang.ranks[0]).pid, 106u) << hang.summary;
  EXPECT_EQ(hang.comm, tp + 3) << "the stall waited on longest: process 7 entered TP #5 first";
  EXPECT_NE(hang.summary.find("5 other communicator(s) stall behind it"), std::string::npos) << hang.summary;
  EXPECT_NE(hang.detail.find("stopped"), std::string::npos) << hang.detail;
  EXPECT_NE(hang.detail.find("went on past collective #5 and wait in other communicators"), std::string::npos)
      << hang.detail;

  // It goes on: every stall clears, and the finding resolves.
  uint64_t later = due + kSecond;
  std::vector<Call> rest = {{6, 5, later, RS_OP_ALLREDUCE, 1024, tp + 3, 0}};
  for (int32_t r = 6; r < 8; ++r) rest.push_back({r, 5, later + kMs, RS_OP_ALLREDUCE, 1024, dp + r % 2, r / 2});
  for (int32_t r = 0; r < 8; ++r) {  // and the next step
    rest.push_back({r, 6, later + 2 * kMs, RS_OP_ALLREDUCE, 1024, tp + r / 2, r % 2});
    rest.push_back({r, 6, later + 3 * kMs, RS_OP_ALLREDUCE, 1024, dp + r % 2, r / 2});
  }
  calls(rest);
  keep_talking(later + 4 * kMs);
  evaluate_at(later + 4 * kMs);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << summaries(open(FindingKind::hang));
}

// A fleet: the job above hangs beside a second job (processes 8-11, one
// data-parallel communicator) whose collectives are in flight. Stalls are
// followed only through the jobs of those that timed out; the second job's
// own hang, when it comes, is a finding of its own, not folded into the
// first job's.
TEST_F(DetectTest, AHangIsFoldedWithinItsOwnJobBesideAnotherJobsStalls) {
  start(12, true, {8, 9, 10, 11});
  const uint64_t tp = kComm + 1, dp = kComm + 10, other = kComm + 20;
  for (int32_t i = 0; i < 4; ++i) register_comm(tp + i, {2 * i, 2 * i + 1});
  for (int32_t g = 0; g < 2; ++g) register_comm(dp + g, {g, g + 2, g + 4, g + 6});
  for (int32_t rank = 8; rank < 12; rank += 2) {
    testing::AgentBatch b = batch(node_of(rank));
    for (int32_t r = rank; r < rank + 2; ++r) {
      b.processes.push_back(testing::process(100 + r, "job-2", "chemistry", "bob"));
      b.comms.push_back(testing::member(100 + r, other, r - 8, 4));
    }
    send(node_of(rank), b.bytes());
  }
  const uint64_t t = clock.now;
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 8; ++r) {
      if (r == 6 && step > 4) continue;  // 6 stops after step 4; 7 waits in TP for it
      list.push_back({r, step, t + step * 20 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, tp + r / 2, r % 2});
      if (r < 6 || step <= 4)
        list.push_back({r, step, t + step * 20 * kMs + 10 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, dp + r % 2, r / 2});
    }
    calls(list);
  }
  // Job 2 runs on: ranks 10 and 11 are yet to enter its #40 when job 1 is due.
  const uint64_t due = t + 5 * 20 * kMs + 10 * kMs + options.hang_timeout_ns + kMs;
  std::vector<Call> job2;
  for (uint64_t seq = 0; seq <= 40; ++seq)
    for (int32_t r = 8; r < (seq < 40 ? 12 : 10); ++r)
      job2.push_back({r, seq, t + seq * (due - t) / 40 + r * 1000, RS_OP_ALLREDUCE, 1024, other, r - 8});
  calls(job2);
  keep_talking(due);
  health(6, 'T', 1000, due);
  evaluate_at(due);

  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  EXPECT_EQ(hangs[0]->job, "job-1");
  ASSERT_EQ(hangs[0]->ranks.size(), 1u) << hangs[0]->summary;
  EXPECT_EQ(ingest.comms().at(hangs[0]->comm).members.at(hangs[0]->ranks[0]).pid, 106u) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->summary.find("5 other communicator(s) stall behind it"), std::string::npos) << hangs[0]->summary;

  // Job 2's #40 never completes either: a hang of its own, naming its missing ranks.
  const uint64_t later = due + options.hang_timeout_ns + kSecond;
  keep_talking(later);
  health(6, 'T', 1000, later);
  evaluate_at(later);
  hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 2u) << summaries(hangs);
  const Finding* first = hangs[0]->job == "job-1" ? hangs[0] : hangs[1];
  const Finding* second = hangs[0]->job == "job-1" ? hangs[1] : hangs[0];
  EXPECT_EQ(second->job, "job-2") << summaries(hangs);
  EXPECT_EQ(second->comm, other);
  EXPECT_EQ(second->ranks, (std::vector<int32_t>{2, 3})) << second->summary;
  EXPECT_EQ(second->seq, 40);
  EXPECT_NE(first->summary.find("5 other communicator(s) stall behind it"), std::string::npos) << first->summary;
  EXPECT_EQ(second->summary.find("stall behind it"), std::string::npos) << second->summary;
}

// As a real job's host calls go: NCCL only enqueues, so a rank issues its
// next collective before the last one ran. 4 processes, tensor-parallel
// pairs {0,1} {2,3} within the nodes, data-parallel groups {0,2} {1,3}
// across them; each step a TP AllReduce, then a DP AllReduce. Process 3
// stops after it issued step 5's both: every rank issued every
// communicator's last collective, so all four stall with every rank
// inside, each behind another in a ring (the TP pairs went on to DP; DP
// {0,2} runs after TP {2,3} on process 2's GPU). The stopped process holds
// them all: one hang names it, whichever order they are looked at in.
TEST_F(DetectTest, AStoppedRankThatIssuedEveryCallIsOneHangNamingIt) {
  start(4);
  const uint64_t tp = kComm + 1, dp = kComm + 10;
  for (int32_t i = 0; i < 2; ++i) register_comm(tp + i, {2 * i, 2 * i + 1});
  for (int32_t g = 0; g < 2; ++g) register_comm(dp + g, {g, g + 2});
  const uint64_t t = clock.now;
  for (uint64_t step = 0; step <= 5; ++step) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 4; ++r) {
      list.push_back({r, step, t + step * 20 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, tp + r / 2, r % 2});
      list.push_back({r, step, t + step * 20 * kMs + 10 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, dp + r % 2, r / 2});
    }
    calls(list);
  }
  const uint64_t due = t + 5 * 20 * kMs + 10 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  health(3, 'T', 1000, due);
  evaluate_at(due);

  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  const Finding& hang = *hangs[0];
  ASSERT_EQ(hang.ranks.size(), 1u) << hang.summary;
  EXPECT_EQ(ingest.comms().at(hang.comm).members.at(hang.ranks[0]).pid, 103u) << hang.summary;
  EXPECT_NE(hang.summary.find("cannot progress (process stopped or exited)"), std::string::npos) << hang.summary;
  EXPECT_NE(hang.summary.find("3 other communicator(s) stall behind it"), std::string::npos) << hang.summary;
}

// The other way round: rank R never enters communicator B's collective #7;
// process P entered it, then issued #3 on A = {P, Q}, which Q issued too
// before it stopped (a watchdog killed it, say). A cannot run on P's GPU
// before B #7: it waits behind B, and so on R, whatever became of Q. One
// hang names R.
TEST_F(DetectTest, AStallWithAStoppedRankBehindAnotherStallWaitsOnThatOne) {
  start(3);  // P = 0 and Q = 1 on node-0, R = 2 on node-1
  const uint64_t b = kComm + 1, a = kComm + 2;
  register_comm(b, {0, 2});
  register_comm(a, {0, 1});
  const uint64_t t = clock.now;
  std::vector<Call> list;
  for (uint64_t step = 0; step < 7; ++step)
    for (int32_t r : {0, 2}) list.push_back({r, step, t + step * 10 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, b, r / 2});
  list.push_back({0, 7, t + 7 * 10 * kMs, RS_OP_ALLREDUCE, 1024, b, 0});  // R never enters #7; P did, before A #3
  for (uint64_t step = 0; step <= 3; ++step)
    for (int32_t r : {0, 1})
      list.push_back({r, step, t + step * 40 * kMs + 5 * kMs + r * 1000, RS_OP_ALLREDUCE, 1024, a, r});
  calls(list);
  const uint64_t due = t + 3 * 40 * kMs + 5 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  health(1, 'T', 1000, due);
  evaluate_at(due);

  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  ASSERT_EQ(hangs[0]->ranks.size(), 1u) << hangs[0]->summary;
  EXPECT_EQ(hangs[0]->comm, b) << hangs[0]->summary;
  EXPECT_EQ(ingest.comms().at(b).members.at(hangs[0]->ranks[0]).pid, 102u) << hangs[0]->summary;
}

TEST_F(DetectTest, AStageWhoseLastHalfMatchedWaitsOnTheEarlierHalfThatDidNot) {
  // A pipeline of three stages (processes 0, 1, 2; communicator kComm + 1),
  // each step a group of Sends and Recvs to both neighbours, then an
  // AllReduce of stages 1 and 2 (kComm + 2). Process 0 stops after step 4.
  // Stage 1's step-5 group waits on its halves with stage 0; its last call
  // (the Recv from stage 2) matched. The AllReduce #5 waits for stage 1: it
  // stalls behind stage 0, not on a rank of its own.
  start(3);
  const uint64_t pp = kComm + 1, dp = kComm + 2;
  register_comm(pp, {0, 1, 2});
  register_comm(dp, {1, 2});
  auto lane = [](int32_t peer, bool recv) { return 1 + 2 * static_cast<uint32_t>(peer) + (recv ? 1 : 0); };
  uint64_t t = clock.now;
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<Call> list;
    uint64_t at = t + step * 20 * kMs;
    for (int32_t s = 0; s < 3; ++s) {
      if (s == 0 && step == 5) continue;  // stopped
      uint64_t half = at + static_cast<uint64_t>(s) * 100'000;
      for (int32_t peer : {s - 1, s + 1}) {
        if (peer < 0 || peer > 2) continue;
        for (bool recv : {false, true}) {
          list.push_back({s, step, half, recv ? RS_OP_RECV : RS_OP_SEND, 1024, pp, s, lane(peer, recv)});
          half += 1000;
        }
      }
    }
    if (step < 5) list.push_back({1, step, at + 10 * kMs, RS_OP_ALLREDUCE, 1024, dp, 0});
    list.push_back({2, step, at + 10 * kMs + 1000, RS_OP_ALLREDUCE, 1024, dp, 1});
    calls(list);
  }
  uint64_t due = t + 100 * kMs + 10 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  health(0, 'T', 1000, due);
  evaluate_at(due);

  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  EXPECT_EQ(hangs[0]->comm, pp) << hangs[0]->summary;
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{0}) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->summary.find("1 other communicator(s) stall behind it"), std::string::npos) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->detail.find("stopped"), std::string::npos) << hangs[0]->detail;
}

TEST_F(DetectTest, ARankThatNeverPostsItsRecvIsAHangOfItsPipelineAndTheJobWaitsBehindIt) {
  // Two pipelines of two stages, {0,1} and {2,3}, each its own
  // communicator: each step stage 0 sends to stage 1, then all four ranks
  // AllReduce (kComm). Process 1 stops after step 4: process 0's Send #5
  // waits for a Recv that never comes, and the AllReduce #5 waits for both.
  start(4);
  register_comm(kComm + 1, {0, 1});
  register_comm(kComm + 2, {2, 3});
  uint64_t t = clock.now;
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<Call> list;
    uint64_t at = t + step * 20 * kMs;
    for (int32_t p = 0; p < 2; ++p) {
      int32_t first = 2 * p;
      list.push_back({first, step, at, RS_OP_SEND, 1024, kComm + 1 + p, 0, 3});  // to comm rank 1
      if (first + 1 == 1 && step == 5) continue;                                   // stopped
      list.push_back({first + 1, step, at + 1000, RS_OP_RECV, 1024, kComm + 1 + p, 1, 2});  // from comm rank 0
    }
    for (int32_t r = 0; r < 4; ++r)
      if (step < 5 || r >= 2) list.push_back({r, step, at + 10 * kMs});
    calls(list);
  }
  uint64_t due = t + 100 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  health(1, 'T', 1000, due);
  evaluate_at(due);

  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u) << summaries(hangs);
  EXPECT_EQ(hangs[0]->comm, kComm + 1);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NE(hangs[0]->summary.find("rank 1 never posted the Recv matching rank 0's Send #5"), std::string::npos)
      << hangs[0]->summary;
  EXPECT_NE(hangs[0]->summary.find("1 other communicator(s) stall behind it"), std::string::npos) << hangs[0]->summary;
  EXPECT_NE(hangs[0]->detail.find("stopped"), std::string::npos) << hangs[0]->detail;

  // The Recv comes: the pair completes, the AllReduce too; all resolve.
  calls({{1, 5, due + kMs, RS_OP_RECV, 1024, kComm + 1, 1, 2}, {0, 5, due + 2 * kMs}, {1, 5, due + 2 * kMs}});
  keep_talking(due + 3 * kMs);
  evaluate_at(due + 3 * kMs);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << summaries(open(FindingKind::hang));
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

// NCCL moving past a mismatched call may have corrupted data: the finding
// stays open when the job goes on and when it ends, until acknowledged
// (through the query API, as `rankscope ack ID` does).
TEST_F(DetectTest, AMismatchStaysOpenUntilAcknowledged) {
  start(4);
  uint64_t t = clock.now;
  instance(0, t);
  calls({{0, 1, t + kMs}, {1, 1, t + kMs}, {2, 1, t + kMs, RS_OP_ALLGATHER}, {3, 1, t + kMs}});
  ASSERT_EQ(open(FindingKind::mismatch).size(), 1u);
  uint64_t id = open(FindingKind::mismatch)[0]->id;
  for (uint64_t seq = 2; seq < 6; ++seq) instance(seq, t + seq * 10 * kMs);  // every rank goes on
  keep_talking(t + kSecond);
  evaluate_at(t + kSecond);
  auto still = open(FindingKind::mismatch);
  ASSERT_EQ(still.size(), 1u) << "the job moving on does not resolve it";
  EXPECT_NE(still[0]->detail.find("went on past this collective"), std::string::npos) << still[0]->detail;
  EXPECT_NE(still[0]->detail.find("rankscope ack " + std::to_string(id)), std::string::npos) << still[0]->detail;

  // An operator acknowledges it over the query API.
  QueryContext context{ingest, *store, book, clock, 5 * kSecond};
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  auto ack = req.initAck();
  ack.setId(id);
  ack.setBy("alice");
  std::string reply = answer_query(proto::to_packed(request), context, "ops-laptop");
  bool acked = false;
  ASSERT_TRUE(proto::read_packed<proto::query::Reply>(reply, proto::ReadLimits{}, [&](proto::query::Reply::Reader r) {
    ASSERT_EQ(r.which(), proto::query::Reply::ACK) << (r.isError() ? std::string(r.getError()) : "");
    EXPECT_EQ(r.getAck().getId(), id);
    EXPECT_NE(r.getAck().getResolvedNs(), 0u);
    EXPECT_EQ(std::string(r.getAck().getAcknowledgedBy()), "alice (key ops-laptop)");
    acked = true;
  }));
  EXPECT_TRUE(acked);
  EXPECT_TRUE(open(FindingKind::mismatch).empty());

  // An unknown id is a clear error.
  ack.setId(id + 1000);
  reply = answer_query(proto::to_packed(request), context, "ops-laptop");
  ASSERT_TRUE(proto::read_packed<proto::query::Reply>(reply, proto::ReadLimits{}, [&](proto::query::Reply::Reader r) {
    ASSERT_TRUE(r.isError());
    EXPECT_NE(std::string(r.getError()).find("no finding #" + std::to_string(id + 1000)), std::string::npos)
        << std::string(r.getError());
  }));
}

// A timeline query over every call of a big job is answered between
// batches: its reply is bounded (kMaxTimelineRecords), each rank giving its
// last calls, and says so; one rank's whole timeline still comes whole.
TEST_F(DetectTest, ATimelineReplyIsBoundedAndSaysSo) {
  constexpr uint64_t kCalls = 70'000;  // x 4 ranks: past the bound
  start(4);
  std::vector<Call> list;
  for (uint64_t seq = 0; seq < kCalls; ++seq)
    for (int32_t r = 0; r < 4; ++r) list.push_back({r, seq, clock.now + seq * kMs + static_cast<uint64_t>(r) * 1000});
  calls(list);
  QueryContext context{ingest, *store, book, clock, 5 * kSecond};
  auto ask = [&](int32_t rank, std::map<int32_t, std::pair<uint64_t, uint64_t>>& seqs, uint32_t& limited) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<proto::query::Request>();
    req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
    auto t = req.initTimeline();
    t.setComm("feedface");
    t.setRank(rank);
    t.setLast(0);
    std::string reply = answer_query(proto::to_packed(request), context);
    size_t n = 0;
    EXPECT_TRUE(proto::read_packed<proto::query::Reply>(reply, proto::ReadLimits{}, [&](proto::query::Reply::Reader r) {
      ASSERT_EQ(r.which(), proto::query::Reply::TIMELINE) << (r.isError() ? std::string(r.getError()) : "");
      limited = r.getTimeline().getLimitedTo();
      for (auto rec : r.getTimeline().getRecords()) {
        auto [it, first] = seqs.try_emplace(rec.getRank(), rec.getSeq(), rec.getSeq());
        it->second.first = std::min(it->second.first, rec.getSeq());
        it->second.second = std::max(it->second.second, rec.getSeq());
        ++n;
      }
    }));
    return n;
  };
  std::map<int32_t, std::pair<uint64_t, uint64_t>> seqs;
  uint32_t limited = 0;
  EXPECT_EQ(ask(-1, seqs, limited), kMaxTimelineRecords);
  EXPECT_EQ(limited, kMaxTimelineRecords / 4);
  ASSERT_EQ(seqs.size(), 4u);
  for (const auto& [rank, range] : seqs) {
    EXPECT_EQ(range.first, kCalls - kMaxTimelineRecords / 4) << "rank " << rank << ": not its last calls";
    EXPECT_EQ(range.second, kCalls - 1);
  }
  seqs.clear();
  EXPECT_EQ(ask(2, seqs, limited), kCalls);
  EXPECT_EQ(limited, 0u);
  EXPECT_EQ(seqs.at(2), std::make_pair(uint64_t{0}, kCalls - 1));
}

TEST_F(DetectTest, AJobHeldAtAMismatchedCollectiveRaisesNoHangBesideTheMismatchWhichCountsThem) {
  // Tensor-parallel pairs {0,1} {2,3} and a world AllReduce each step; at
  // step 1, rank 2 calls AllGather where the others call AllReduce. NCCL
  // waits there for ever: the world collective has every rank inside and
  // does not move. Each rank's host goes on to issue its pair's next
  // AllReduce, which its GPU runs only after the mismatched one: the pairs'
  // communicators stall behind it. The mismatch finding tells it, and
  // counts them; a hang ("suspect the network or a GPU") would send the
  // operator after the wrong cause.
  start(4);
  const uint64_t tp = kComm + 1;
  for (int32_t i = 0; i < 2; ++i) register_comm(tp + i, {2 * i, 2 * i + 1});
  uint64_t t = clock.now;
  for (uint64_t step = 0; step < 2; ++step) {
    std::vector<Call> list;
    uint64_t at = t + step * 20 * kMs;
    for (int32_t r = 0; r < 4; ++r) list.push_back({r, step, at + r * 1000, RS_OP_ALLREDUCE, 1024, tp + r / 2, r % 2});
    for (int32_t r = 0; r < 4; ++r)
      list.push_back({r, step, at + 10 * kMs, step == 1 && r == 2 ? RS_OP_ALLGATHER : RS_OP_ALLREDUCE});
    if (step == 1)
      for (int32_t r = 0; r < 4; ++r) list.push_back({r, 2, at + 15 * kMs, RS_OP_ALLREDUCE, 1024, tp + r / 2, r % 2});
    calls(list);
  }
  ASSERT_EQ(open(FindingKind::mismatch).size(), 1u);
  EXPECT_EQ(open(FindingKind::mismatch)[0]->detail.find("Held behind it"), std::string::npos)
      << "nothing has stalled yet";
  uint64_t due = t + 40 * kMs + options.hang_timeout_ns + kMs;
  keep_talking(due);
  evaluate_at(due);
  evaluate_at(due + kSecond);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << summaries(open(FindingKind::hang));
  auto mismatch = open(FindingKind::mismatch);
  ASSERT_EQ(mismatch.size(), 1u);
  EXPECT_NE(mismatch[0]->detail.find("Held behind it: 2 other communicators of this job, stalled since"),
            std::string::npos)
      << mismatch[0]->detail;
}

TEST_F(DetectTest, AMismatchOutlivesItsJob) {
  start(4);
  uint64_t t = clock.now;
  calls({{0, 0, t}, {1, 0, t}, {2, 0, t, RS_OP_ALLGATHER}, {3, 0, t}});
  ASSERT_EQ(open(FindingKind::mismatch).size(), 1u);
  keep_talking(t + kMs);
  evaluate_at(t + kMs);  // the detector knows the communicator
  end_comm({0, 1, 2, 3});  // every member ends it: the job is over
  ASSERT_TRUE(ingest.comms().at(kComm).ended);
  keep_talking(t + 2 * kSecond);
  evaluate_at(t + 2 * kSecond);
  EXPECT_EQ(open(FindingKind::mismatch).size(), 1u) << "ended communicators resolve their hangs, not a mismatch";
}

TEST_F(DetectTest, PersistentlyLateRankIsAStragglerAndRecovers) {
  start(4);
  uint64_t t = clock.now;
  uint64_t seq = 0;
  auto step = [&](int64_t late) {
    instance(seq, t + seq * 20 * kMs, [&](int32_t r) { return (r == 1 ? late : 0) + (r * 37 + seq * 11) % 300 * 1000; });
    ++seq;
  };
  // On time for a window and a bucket at first (its structure is learnt
  // from full windows), then late. Instances are scored once settled:
  // evaluations come settle_ns after the last one.
  const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (20 * kMs);
  for (uint64_t i = 0; i < window_steps; ++i) step(0);
  for (uint64_t i = 0; i < window_steps; ++i) step(10 * kMs);
  for (int i = 0; i < kTicks; ++i) evaluate_at(t + seq * 20 * kMs + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001);
  EXPECT_GT(stragglers[0]->wait_share, 0.2);
  EXPECT_GT(stragglers[0]->gpu_hours_lost, 0.0);

  // On time again for as long as the window (and a bucket of it): resolved.
  for (uint64_t i = 0; i < window_steps; ++i) step(0);
  for (int i = 0; i < options.close_after; ++i) evaluate_at(t + seq * 20 * kMs + options.settle_ns + i * kMs);
  EXPECT_TRUE(open(FindingKind::straggler).empty());
}

TEST_F(DetectTest, InstancesScoredBetweenEvaluationsGiveTheSameStraggler) {
  // The test above with settled instances scored between evaluations, as
  // the collector's loop does between batches: every third step, one
  // instance's 4 members (the budget), of the 3 settled since; and an
  // evaluation every 25 steps, which scores the rest: the same finding, on
  // the same figures.
  start(4);
  uint64_t t = clock.now;
  uint64_t seq = 0;
  size_t scored = 0;
  auto step = [&](int64_t late) {
    instance(seq, t + seq * 20 * kMs,
             [&](int32_t r) { return (r == 1 ? late : 0) + (r * 37 + seq * 11) % 300 * 1000; });
    ++seq;
    const uint64_t now = t + seq * 20 * kMs + options.settle_ns;
    if (seq % 3 == 0) {
      const size_t now_scored = detector->score_some(now, 4);
      EXPECT_LE(now_scored, 4u) << "one instance whole, none begun past the budget";
      scored += now_scored;
    }
    if (seq % 25 == 0) evaluate_at(now);
  };
  const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (20 * kMs);
  for (uint64_t i = 0; i < window_steps; ++i) step(0);
  for (uint64_t i = 0; i < window_steps; ++i) step(10 * kMs);
  EXPECT_GT(scored, 0u);
  for (int i = 0; i < kTicks; ++i) evaluate_at(t + seq * 20 * kMs + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001);
  EXPECT_GT(stragglers[0]->wait_share, 0.2);
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

TEST_F(DetectTest, StructurallySlowerStageIsNotAStragglerButItsRankSlowingFurtherIs) {
  // 16 ranks; the last "pipeline stage" (ranks 12-15) computes 20% longer
  // on every step since the job began: late at every collective over all
  // ranks, by far more than the floor, and not a fault.
  start(16);
  std::mt19937 rng(7);
  std::lognormal_distribution<double> jitter(0, 0.01);
  std::vector<uint64_t> ready(16, clock.now);
  uint64_t seq = 0;
  auto step = [&](int32_t slowed, double factor) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 16; ++r) {
      double c = 100.0 * kMs * jitter(rng) * (r >= 12 ? 1.2 : 1.0) * (r == slowed ? factor : 1.0);
      ready[r] += static_cast<uint64_t>(c);
      list.push_back({r, seq, ready[r]});
    }
    calls(list);
    uint64_t release = *std::max_element(ready.begin(), ready.end()) + 100'000;
    std::fill(ready.begin(), ready.end(), release);
    ++seq;
  };
  for (int i = 0; i < 120; ++i) {
    step(-1, 1);
    if (i % 5 == 0) evaluate_at(ready[0] + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto none = open(FindingKind::straggler);
  EXPECT_TRUE(none.empty()) << none.front()->detail;

  // Rank 13 of that stage slows down by 1.05x more: 6 ms a step over its
  // own structure, found within 30 s (240 steps).
  for (int i = 0; i < 240; ++i) step(13, 1.05);
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{13});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.006, 0.002);
  EXPECT_NE(stragglers[0]->detail.find("its own structural share: "), std::string::npos) << stragglers[0]->detail;
  EXPECT_EQ(stragglers[0]->detail.find("its own structural share: 0.0%"), std::string::npos) << stragglers[0]->detail;
}

TEST_F(DetectTest, RankThatWaitedForASlowPipelinePartnerIsNotBlamed) {
  // 8 processes: stage 0 = ranks 0-3, stage 1 = ranks 4-7; pipeline i is
  // {i, i + 4}, its own communicator, exchanging Send/Recv each step (lanes
  // 1 + 2 x peer + recv); a collective over all 8 (kComm) follows. From
  // step 330 on (6 s: its structure is learnt from full windows), rank 5
  // computes twice as long: its partner, rank 1, waits
  // for it at their exchange and reaches the collective 8 ms late, as late
  // as rank 5 is from the exchange alone. Only rank 5 is to blame.
  start(8);
  for (int32_t i = 0; i < 4; ++i) register_comm(kComm + 1 + i, {i, i + 4});
  std::vector<uint64_t> ready(8, clock.now);
  auto work = [&](int32_t r, uint64_t step, uint64_t ms) {
    uint64_t c = ms * kMs + (r * 37 + step * 11) % 300 * 1000;
    return r == 5 && step >= 330 ? 2 * c : c;
  };
  // 6 s more: late for longer than the window (straggler.window_ns).
  for (uint64_t step = 0; step < 550; ++step) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 8; ++r) ready[r] += work(r, step, 8);
    for (int32_t i = 0; i < 4; ++i) {
      uint64_t comm = kComm + 1 + i;
      // Comm rank 0 (process i) sends to 1 on lane 3, receives on lane 4; comm rank 1 the reverse on lanes 1, 2.
      list.push_back({i, step, ready[i], RS_OP_SEND, 1024, comm, 0, 3});
      list.push_back({i, step, ready[i] + 2000, RS_OP_RECV, 1024, comm, 0, 4});
      list.push_back({i + 4, step, ready[i + 4], RS_OP_SEND, 1024, comm, 1, 1});
      list.push_back({i + 4, step, ready[i + 4] + 2000, RS_OP_RECV, 1024, comm, 1, 2});
      uint64_t release = std::max(ready[i], ready[i + 4]) + 2000 + 100'000;
      ready[i] = ready[i + 4] = release;
    }
    for (int32_t r = 0; r < 8; ++r) {  // the collective over all ranks
      ready[r] += work(r, step, 10);
      list.push_back({r, step, ready[r]});
    }
    calls(list);
    uint64_t release = *std::max_element(ready.begin(), ready.end()) + 100'000;
    std::fill(ready.begin(), ready.end(), release);
    if (step % 5 == 0) evaluate_at(release + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->comm, kComm);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{5}) << "rank 1 arrived 8 ms late too, waiting for rank 5";
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001) << "its own extra compute, not its partner's wait";
}

TEST_F(DetectTest, AStageHeldByItsPartnersSlowStreamIsNotBlamed) {
  // 8 processes: stage 0 = ranks 0-3 sends to stage 1 = ranks 4-7 (pipeline
  // i is {i, i + 4}, its own communicator), whose hosts wait on their
  // streams until the data is in (cudaStreamSynchronize after the Recv),
  // compute 10 ms on it and enter a collective over all 8 (kComm). From
  // step 330 on, rank 1 is starved of CPU: its host computes twice as long,
  // and its stream (NCCL's proxy thread, starved with it) moves the data 8
  // ms after it issued the Send. Rank 5 waits those 8 ms for it and reaches
  // the collective late from the pair's release (the Send's issue), as
  // late as rank 1's stream was: only rank 1 is to blame.
  start(8);
  for (int32_t i = 0; i < 4; ++i) register_comm(kComm + 1 + i, {i, i + 4});
  std::vector<uint64_t> ready(8, clock.now);
  auto work = [&](int32_t r, uint64_t step, uint64_t ms) {
    uint64_t c = ms * kMs + (r * 37 + step * 11) % 300 * 1000;
    return r == 1 && step >= 330 ? 2 * c : c;
  };
  for (uint64_t step = 0; step < 550; ++step) {
    std::vector<Call> list;
    std::vector<std::pair<uint64_t, uint64_t>> waits(4);
    for (int32_t r = 0; r < 8; ++r) ready[r] += work(r, step, 8);
    for (int32_t i = 0; i < 4; ++i) {
      uint64_t comm = kComm + 1 + i;
      // Comm rank 0 (process i) sends to 1 on lane 3; comm rank 1 receives on lane 2.
      list.push_back({i, step, ready[i], RS_OP_SEND, 1024, comm, 0, 3});
      list.push_back({i + 4, step, ready[i + 4], RS_OP_RECV, 1024, comm, 1, 2});
      uint64_t moved = std::max(ready[i], ready[i + 4]) + (i == 1 && step >= 330 ? 8 * kMs : 500'000);
      waits[i] = {ready[i + 4] + 20'000, moved};
      ready[i + 4] = moved;
    }
    for (int32_t r = 0; r < 8; ++r) {  // the collective over all ranks
      ready[r] += work(r, step, 10);
      list.push_back({r, step, ready[r]});
    }
    calls(list);
    for (int32_t i = 0; i < 4; ++i) host_wait(i + 4, waits[i].first, waits[i].second);
    uint64_t release = *std::max_element(ready.begin(), ready.end()) + 100'000;
    std::fill(ready.begin(), ready.end(), release);
    if (step % 5 == 0) evaluate_at(release + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->comm, kComm);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1}) << "rank 5 waited for rank 1's data: not its own time";
}

TEST_F(DetectTest, AStageReleasedLateByItsPartnerIsNotOwedTheCallsItIssuesRightAfter) {
  // Two pipelines of two stages, as fakenccl's pipeline: process 0 and 2
  // are stage 0, 1 and 3 stage 1; {0, 2} and {1, 3} are data-parallel
  // groups. Per step, stage 1 computes and sends to its stage 0, which
  // waits on its stream for the data; then every rank computes, issues its
  // group's AllReduce and at once one over all 4 (kComm), and waits for
  // them. From step 150 on, rank 3 is starved of CPU: it computes 11-23 ms
  // longer and its data moves 8-20 ms late. Rank 2 is then last at both
  // AllReduces, every step, by as much as it waited for rank 3's data; at
  // the one over all ranks, 0 and 1 issued before their own group's was
  // released (they ran ahead) and 2 did not: only rank 3 is to blame.
  start(4);
  const uint64_t kStage0 = kComm + 1, kStage1 = kComm + 2;
  register_comm(kStage0, {0, 2});
  register_comm(kStage1, {1, 3});
  std::vector<uint64_t> ready(4, clock.now);
  auto jitter = [](int32_t r, uint64_t step) { return (r * 37 + step * 11) % 300 * 1000; };
  for (uint64_t step = 0; step < 450; ++step) {
    const bool starved = step >= 150;
    std::vector<Call> list;
    std::vector<std::pair<uint64_t, uint64_t>> waits(4);
    for (int32_t first : {0, 2}) {
      const int32_t second = first + 1;
      ready[second] += 12 * kMs + jitter(second, step) + (second == 3 && starved ? (6 + 4 * (step % 3)) * kMs : 0);
      list.push_back({second, step, ready[second], RS_OP_SEND, 1024, kComm, -1, 1 + 2 * static_cast<uint32_t>(first)});
      list.push_back({first, step, ready[first], RS_OP_RECV, 1024, kComm, -1, 2 + 2 * static_cast<uint32_t>(second)});
      const uint64_t moved =
          std::max(ready[first], ready[second]) + (second == 3 && starved ? (8 + 4 * (step % 4)) * kMs : 500'000);
      waits[first] = {ready[first] + 20'000, moved + 50'000};
      ready[first] = moved + 50'000;
    }
    for (int32_t r = 0; r < 4; ++r) {
      ready[r] += 10 * kMs + jitter(r, step) + (r == 3 && starved ? (5 + 2 * (step % 3)) * kMs : 0);
      list.push_back({r, step, ready[r], RS_OP_ALLREDUCE, 1024, r % 2 ? kStage1 : kStage0, r / 2});
      list.push_back({r, step, ready[r] + 30'000});
    }
    calls(list);
    for (int32_t first : {0, 2}) host_wait(first, waits[first].first, waits[first].second);
    const uint64_t done = *std::max_element(ready.begin(), ready.end()) + 30'000 + 500'000;
    for (int32_t r = 0; r < 4; ++r) {
      host_wait(r, ready[r] + 50'000, done + 50'000);
      ready[r] = done + 50'000;
    }
    if (step % 5 == 0) evaluate_at(done + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_GE(stragglers.size(), 1u);
  for (const Finding* f : stragglers) {
    // Rank 3 is comm rank 1 of its group, world rank 3.
    EXPECT_EQ(f->ranks, std::vector<int32_t>{f->comm == kStage1 ? 1 : 3}) << summaries(stragglers);
    EXPECT_NE(f->comm, kStage0) << summaries(stragglers);
  }
}

TEST_F(DetectTest, ARankHeldByItsOwnGpuWorkIsStillNamed) {
  // 4 ranks, 40 ms steps: each host works 5 ms after the step's collective,
  // then waits on its stream for its own GPU work (as loss.item() does)
  // and issues the next collective. From step 150 on, rank 2's GPU takes 8
  // ms longer: its wait ends late and it issues late. That wait began long
  // after the collective's release, so it was for its own work, not the
  // others' data: rank 2 is found on the host side.
  start(4);
  std::vector<uint64_t> ready(4, clock.now);
  for (uint64_t step = 0; step < 300; ++step) {
    std::vector<Call> list;
    std::vector<std::pair<uint64_t, uint64_t>> waits(4);
    for (int32_t r = 0; r < 4; ++r) {
      uint64_t start = ready[r] + 5 * kMs;
      uint64_t end = start + 30 * kMs + (r * 37 + step * 11) % 300 * 1000 + (r == 2 && step >= 150 ? 8 * kMs : 0);
      waits[r] = {start, end};
      ready[r] = end + 50'000;
      list.push_back({r, step, ready[r]});
    }
    calls(list);
    for (int32_t r = 0; r < 4; ++r) host_wait(r, waits[r].first, waits[r].second);
    uint64_t release = *std::max_element(ready.begin(), ready.end()) + 100'000;
    std::fill(ready.begin(), ready.end(), release);
    if (step % 5 == 0) evaluate_at(release + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{2});
}

TEST_F(DetectTest, ACpuStarvedRankWokenLateFromItsWaitIsStillNamed) {
  // 4 ranks, ~30 ms steps: compute, the step's collective, then a wait on
  // the stream until its data has moved (500 us after the last arrival).
  // From step 150 on, rank 2 shares its core with busy neighbours: woken at
  // the end of its wait, it waits 8 ms more for a CPU before it returns.
  // Its own wait's end is no measure of when the data came (the others'
  // waits ended 8 ms before): that delay is its own, and it is named.
  start(4);
  std::vector<uint64_t> ready(4, clock.now);
  for (uint64_t step = 0; step < 300; ++step) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 4; ++r) {
      ready[r] += 30 * kMs + (r * 37 + step * 11) % 300 * 1000;
      list.push_back({r, step, ready[r]});
    }
    calls(list);
    const uint64_t moved = *std::max_element(ready.begin(), ready.end()) + 500'000;
    for (int32_t r = 0; r < 4; ++r) {
      const uint64_t end = moved + (r == 2 && step >= 150 ? 8 * kMs : 50'000);
      host_wait(r, ready[r] + 20'000, end);
      ready[r] = end;
    }
    if (step % 5 == 0) evaluate_at(moved + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{2});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.008, 0.001) << "its own late waking, not less";
}

TEST(HostWait, AWaitPutOnAMovedClockEstimateCountsForItsExchangeWithinTheMargin) {
  // The last member arrived at 1 s (the release); the exchange's data moved
  // 300 ms later. Its synchronize began 20 us after its arrival on its own
  // clock, but its node's estimate moved 4 ms forward between the batch of
  // its call and the batch of its wait: on the cluster clock the wait
  // seems to begin 4.02 ms after the release. With the clocks' margin
  // (4 ms: the move) it waited for the exchange; without, it did not (a
  // wait for GPU work of its own), and it was taken as free at the release,
  // late by the whole transfer at its next collective.
  const uint64_t release = 1'000'000'000, arrival = release;
  const uint64_t start = arrival + 20'000 + 4 * kMs, end = release + 300 * kMs + 4 * kMs;
  EXPECT_TRUE(waited_for(start, end, arrival, release, 4 * kMs));
  EXPECT_FALSE(waited_for(start, end, arrival, release, 0));
  // Beyond the join and the margin: GPU work of its own, as before.
  EXPECT_FALSE(waited_for(release + 7 * kMs, end, arrival, release, 4 * kMs));
  // A wait that ended before the release waited for something earlier,
  // unless the clocks cannot tell.
  EXPECT_FALSE(waited_for(arrival, release - 5 * kMs, arrival - 10 * kMs, release, 4 * kMs));
  EXPECT_TRUE(waited_for(arrival, release - 3 * kMs, arrival - 10 * kMs, release, 4 * kMs));
  // ... and dates the data no earlier than the release: one such wait never
  // makes the exchange's members free before it.
  EXPECT_EQ(data_moved(release - 3 * kMs, release), release);
  EXPECT_EQ(data_moved(end, release), end);
  // Its estimate moved back instead: the synchronize, begun 35 us after its
  // call, seems to begin 320 us before it (a healthy sync-each job's node
  // in the live run, docs/benchmarks.md). It waited for the exchange; not
  // where the clocks are known closer than that.
  EXPECT_TRUE(waited_for(arrival - 320'000, end, arrival, release, 4 * kMs));
  EXPECT_FALSE(waited_for(arrival - 320'000, end, arrival, release, 300'000));
  // A wait begun before its own arrival beyond the margin never did.
  EXPECT_FALSE(waited_for(arrival - 5 * kMs, end, arrival, release, 4 * kMs));
  // A clock not known yet: an unbounded margin counts as the lookback (1 s).
  EXPECT_TRUE(waited_for(release + 900 * kMs, release + 2 * kSecond, arrival, release, UINT64_MAX / 2));
  EXPECT_FALSE(waited_for(release + 1100 * kMs, release + 2 * kSecond, arrival, release, UINT64_MAX / 2));
}

TEST_F(DetectTest, ABatchLostAndSentAgainDoesNotMakeItsRanksLate) {
  // 4 processes, 2 per node, 100 ms steps: 40 ms of compute, an exchange
  // with the pipeline partner on the other node ({0, 2}, {1, 3}), 40 ms
  // more, a data-parallel AllReduce within the node ({0, 1}, {2, 3}). From
  // 6 s on, node-0's batch with process 0's pipeline call of each step is
  // lost and comes again after the step's AllReduce was complete and
  // settled (an agent re-sends after its ack timeout). Until it comes,
  // process 0's last known release is the step before's, so it looked 40 ms
  // late at its AllReduce at every step, and its partner 1 on time. Its
  // batch came later, not its call: nothing is late. Then process 1
  // computes 1.5x longer before the AllReduce: it is found, and only it,
  // and every instance is scored.
  start(4);
  const uint64_t pipe = kComm + 1, dp = kComm + 3;
  register_comm(pipe, {0, 2});
  register_comm(pipe + 1, {1, 3});
  register_comm(dp, {0, 1});
  register_comm(dp + 1, {2, 3});
  std::vector<uint64_t> ready(4, clock.now);
  auto compute = [&](int32_t r, uint64_t step, double factor) {
    return static_cast<uint64_t>(static_cast<double>(40 * kMs + (r * 37 + step * 11) % 300 * 1000) * factor);
  };
  // Each communicator of the pairs {a, b} (comm ranks 0, 1) at `seq`, then its release.
  auto exchange = [&](uint64_t comm, int32_t a, int32_t b, uint64_t seq, std::vector<Call>& list) {
    list.push_back({a, seq, ready[a], RS_OP_ALLREDUCE, 1024, comm, 0});
    list.push_back({b, seq, ready[b], RS_OP_ALLREDUCE, 1024, comm, 1});
    ready[a] = ready[b] = std::max(ready[a], ready[b]) + 100'000;
  };
  auto run = [&](uint64_t from, uint64_t steps, bool lose, int32_t slow) {
    for (uint64_t step = from; step < from + steps; ++step) {
      std::vector<Call> list;
      for (int32_t r = 0; r < 4; ++r) ready[r] += compute(r, step, 1);
      exchange(pipe, 0, 2, step, list);
      exchange(pipe + 1, 1, 3, step, list);
      // The lost batch holds process 0's pipeline call: numbered before the next ones.
      testing::AgentBatch lost;
      if (lose) {
        lost = batch(node_of(0));
        add_call(lost.calls.emplace_back(), list.front());
        list.erase(list.begin());
      }
      for (int32_t r = 0; r < 4; ++r) ready[r] += compute(r, step, r == slow ? 1.5 : 1);
      exchange(dp, 0, 1, step, list);
      exchange(dp + 1, 2, 3, step, list);
      calls(list);
      evaluate_at(*std::max_element(ready.begin(), ready.end()) + options.settle_ns);
      if (lose) send(node_of(0), lost.bytes());
    }
  };
  run(0, 60, false, -1);
  run(60, 100, true, -1);
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto all = book.all();
  EXPECT_TRUE(all.empty()) << all.size() << " finding(s), the first: " << all.front()->summary;

  run(160, 100, true, 1);
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->comm, dp);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_EQ(detector->scored_incomplete(), 0u);
}

TEST_F(DetectTest, LateRankIsFoundWhenTheHostRunsAheadThroughBackToBackBuckets) {
  // Three buckets per step issued back to back (each before the previous one
  // completed, as DDP does), then a host sync; rank 2 computes 10 ms longer
  // from step 300 on. Only the first bucket of a step follows a release; the
  // others carry the same lateness (plain arrival lateness applies). Late
  // from step 300 on (6 s: its structure is learnt from full windows).
  start(4);
  std::vector<uint64_t> ready(4, clock.now);
  uint64_t seq = 0;
  for (uint64_t step = 0; step < 600; ++step) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 4; ++r) {
      ready[r] += 20 * kMs + (r * 37 + step * 11) % 300 * 1000 + (r == 2 && step >= 300 ? 10 * kMs : 0);
      for (uint64_t b = 0; b < 3; ++b) list.push_back({r, seq + b, ready[r] + b * 50'000});
    }
    calls(list);
    seq += 3;
    uint64_t release = *std::max_element(ready.begin(), ready.end()) + 2 * 50'000 + 500'000;
    std::fill(ready.begin(), ready.end(), release);
    if (step % 5 == 0) evaluate_at(release + options.settle_ns);
  }
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{2});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001);
}

TEST_F(DetectTest, AJobCompletingThousandsOfCollectivesASecondIsScored) {
  // 2,500 collectives a second (FSDP's per-layer calls): more complete
  // within settle_ns than the settling queue's floor of 1,024 holds. The
  // oldest must be scored early, not dropped (dropped, none was ever
  // scored). Healthy for 6 s (a window and a bucket: its structure), then
  // rank 1's host is 10% slower for 6 s: 40 us more behind at each call
  // (hosts that run ahead: a constant lag would cost its wait once).
  start(4);
  uint64_t t = clock.now;
  uint64_t seq = 0;
  const uint64_t spacing = 400'000;  // 400 us
  const uint64_t onset = 15'000;
  for (int batch = 0; batch < 300; ++batch) {
    std::vector<Call> list;
    for (int i = 0; i < 100; ++i, ++seq)
      for (int32_t r = 0; r < 4; ++r)
        list.push_back({r, seq, t + seq * spacing + (r == 1 && seq >= onset ? (seq - onset) * 40'000 : 0) + (r * 37 + seq * 11) % 100 * 1000});
    calls(list);
    evaluate_at(t + seq * spacing);
  }
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
}

TEST_F(DetectTest, HealthyJobWithBenignConfoundersRaisesNothing) {
  // 32 ranks, 400 collectives: log-normal compute jitter (3%), GC-like
  // pauses (5-60 ms on 0.2% of rank-steps), the last quarter of the ranks
  // 20% slower since the start.
  start(32);
  std::mt19937 rng(11);
  std::lognormal_distribution<double> jitter(0, 0.03);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint64_t> ready(32, clock.now);
  for (uint64_t seq = 0; seq < 400; ++seq) {
    std::vector<Call> list;
    for (int32_t r = 0; r < 32; ++r) {
      double c = 100.0 * kMs * jitter(rng) * (r >= 24 ? 1.2 : 1.0);
      if (u(rng) < 0.002) c += (5 + 55 * u(rng)) * kMs;
      ready[r] += static_cast<uint64_t>(c);
      list.push_back({r, seq, ready[r]});
    }
    calls(list);
    uint64_t release = *std::max_element(ready.begin(), ready.end()) + 100'000;
    std::fill(ready.begin(), ready.end(), release);
    evaluate_at(release + options.settle_ns);
  }
  auto all = book.open();
  EXPECT_TRUE(all.empty()) << all.front()->detail;
}

TEST_F(DetectTest, AJobWhoseStepTimesVaryByDataRaisesNothingAndItsSlowRankIsFound) {
  // 16 ranks whose compute varies by data (log-normal, sigma 0.25: another
  // sequence length per rank and step), 200 ms steps. Some rank arrives
  // last at every step by chance, and at times the same one for several
  // steps: 20 minutes of that is not a straggler. Then rank 5 computes
  // 1.5x longer: found within 30 s, and no other rank.
  start(16);
  std::mt19937 rng(3);
  std::lognormal_distribution<double> compute(0, 0.25);
  std::vector<uint64_t> ready(16, clock.now);
  uint64_t seq = 0;
  // Five steps (about a second) per batch of each rank, as an agent sends them.
  auto second = [&](int32_t slowed, double factor) {
    std::vector<Call> list;
    for (int i = 0; i < 5; ++i, ++seq) {
      for (int32_t r = 0; r < 16; ++r) {
        ready[r] += static_cast<uint64_t>(200.0 * kMs * compute(rng) * (r == slowed ? factor : 1.0));
        list.push_back({r, seq, ready[r]});
      }
      uint64_t release = *std::max_element(ready.begin(), ready.end()) + 100'000;
      std::fill(ready.begin(), ready.end(), release);
    }
    calls(list);
    evaluate_at(ready[0] + options.settle_ns);
  };
  for (int i = 0; i < 1200; ++i) second(-1, 1);
  auto all = book.all();
  EXPECT_TRUE(all.empty()) << all.size() << " finding(s), the first: " << all.front()->detail;
  for (int i = 0; i < 30; ++i) second(5, 1.5);
  for (int i = 0; i < kTicks; ++i) evaluate_at(ready[0] + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u) << summaries(stragglers);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{5});
  // The finding says why it is not chance, in the job's own terms.
  EXPECT_NE(stragglers[0]->detail.find("not chance: its lag behind the median rank gathered "),
            std::string::npos)
      << stragglers[0]->detail;
}

TEST_F(DetectTest, DeadAgentIsOneNodeLostNotHangsOfItsPeers) {
  start(4);  // node-0: ranks 0, 1; node-1: ranks 2, 3
  uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 5; ++seq) instance(seq, t + seq * kMs);
  // node-1's agent dies: nothing more from it. Ranks 0 and 1 enter #5 and wait there.
  instance(5, t + 5 * kMs, nullptr, {2, 3});
  for (uint64_t s = 1; s <= options.node_lost_timeout_ns / kSecond + 1; ++s) {
    clock.now = t + s * kSecond;
    health(0, 'S', 0, 0);  // node-0 keeps talking
    evaluate_at(clock.now);
    auto hangs = open(FindingKind::hang);
    EXPECT_TRUE(hangs.empty()) << "at " << s << " s: " << hangs.front()->summary;
  }
  auto lost = open(FindingKind::node_lost);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0]->nodes, std::vector<std::string>{"node-1"});
  EXPECT_NE(lost[0]->detail.find("1 communicator(s) wait on these unseen ranks; those waits are not reported as "
                                 "separate hangs"),
            std::string::npos)
      << lost[0]->detail;

  // node-1's agent is back and talks; its rank 3 never enters #5: that is a hang.
  clock.now += kSecond;
  health(2, 'S', 0, 0);
  calls({{2, 5, clock.now}});
  evaluate_at(clock.now);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
  EXPECT_TRUE(open(FindingKind::node_lost).empty());
}

TEST_F(DetectTest, LatenessWithinTheClocksUncertaintyBetweenNodesIsNotFlagged) {
  // Rank 2 of node-1 against node-0's ranks 0 and 1 (and its own node's rank 3).
  EXPECT_TRUE(late_under_loose_clocks(4, 2).empty());
}

TEST_F(DetectTest, RanksOfOneNodeShareItsClockWhateverItsUncertainty) {
  // Both ranks on node-0: one clock, however far off the collector's; 20 ms
  // apart at every instance is 20 ms, and its estimate has not moved since.
  auto stragglers = late_under_loose_clocks(2, 1);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.020, 0.001);
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

// A node that said hello and has told nothing yet (a collector behind on
// it): a rank no agent reported may be one of its, its announcement on the
// way. Held back one more timeout at most, as any stall whose node has not
// told; with every node heard in full, named at the timeout (above).
TEST_F(DetectTest, ARankNoAgentReportedIsHeldBackWhileANodeHasToldNothingYet) {
  start(4, true, {3});
  send("node-9", testing::hello_message("node-9", 7));
  const uint64_t t = clock.now;
  for (uint64_t seq = 0; seq < 4; ++seq) instance(seq, t + seq * kMs, nullptr, {3});
  auto talk = [&](uint64_t at) {
    keep_talking(at);
    send("node-9", [](auto m) { m.initHeartbeat().setInstanceId(7); });
  };
  const uint64_t due = t + options.hang_timeout_ns + kSecond;
  talk(due);
  evaluate_at(due);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "node-9 has told nothing yet";
  talk(due + options.hang_timeout_ns + kMs);
  evaluate_at(due + options.hang_timeout_ns + kMs);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
}

TEST_F(DetectTest, DestroyedCommunicatorResolvesItsFindings) {
  start(2);
  uint64_t t = clock.now;
  instance(0, t);
  calls({{0, 1, t + kMs}});
  keep_talking(t + options.hang_timeout_ns + kSecond);
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  ASSERT_EQ(open(FindingKind::hang).size(), 1u);
  // Each member ends its own membership (ncclCommDestroy in each process):
  // the communicator is over, and its findings with it, once all have.
  end_comm({0});
  evaluate_at(clock.now + kMs);
  EXPECT_EQ(open(FindingKind::hang).size(), 1u);  // rank 1 still holds it
  end_comm({1});
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

// The collector's loop held up (a long evaluation, a burst of batches):
// heartbeats may wait unread in its socket. A node is lost once the loop
// has read everything the node could have sent since it was last heard.
TEST_F(DetectTest, ANodeIsLostOnlyOnceTheCollectorReadWhatItCouldHaveSent) {
  start(4);
  instance(0, clock.now);
  const uint64_t t = clock.now;
  ingest.note_drained(t);
  clock.now = t + options.node_lost_timeout_ns + kSecond;
  health(0, 'S', 0, 0);  // node-0's heartbeat is read; node-1's could be waiting
  evaluate_at(clock.now);
  EXPECT_TRUE(open(FindingKind::node_lost).empty()) << summaries(open(FindingKind::node_lost));
  ingest.note_drained(clock.now);  // read empty: node-1 sent nothing
  evaluate_at(clock.now + kMs);
  auto lost = open(FindingKind::node_lost);
  ASSERT_EQ(lost.size(), 1u) << summaries(lost);
  EXPECT_EQ(lost[0]->nodes, std::vector<std::string>{"node-1"});
}

// A loop that never reads its socket empty (overloaded for good) judges on
// what it has read, after two node-lost timeouts.
TEST_F(DetectTest, ALoopThatNeverReadsItsSocketEmptyJudgesSilenceOnWhatItRead) {
  start(4);
  instance(0, clock.now);
  const uint64_t t = clock.now;
  ingest.note_drained(t);
  clock.now = t + 2 * options.node_lost_timeout_ns - kSecond;
  health(0, 'S', 0, 0);
  evaluate_at(clock.now);
  EXPECT_TRUE(open(FindingKind::node_lost).empty()) << summaries(open(FindingKind::node_lost));
  clock.now = t + 2 * options.node_lost_timeout_ns + kSecond;
  health(0, 'S', 0, 0);
  evaluate_at(clock.now);
  auto lost = open(FindingKind::node_lost);
  ASSERT_EQ(lost.size(), 1u) << summaries(lost);
  EXPECT_EQ(lost[0]->nodes, std::vector<std::string>{"node-1"});
}

TEST_F(DetectTest, FindingsSurviveACollectorRestart) {
  start(4);
  uint64_t t = clock.now;
  instance(0, t);
  instance(1, t + kMs, nullptr, {3});
  keep_talking(t + options.hang_timeout_ns + kSecond);
  evaluate_at(t + options.hang_timeout_ns + kSecond);
  ASSERT_EQ(open(FindingKind::hang).size(), 1u);
  const Finding before = *open(FindingKind::hang)[0];
  FindingWriter writer(book);
  commit.join(writer);
  ASSERT_TRUE(commit.run(clock.now));

  // A new collector on the same database: the same open finding, same id,
  // and it still resolves on its own.
  FindingBook restarted;
  ASSERT_TRUE(FindingWriter(restarted).restore(*store));
  auto open_after = restarted.open();
  ASSERT_EQ(open_after.size(), 1u);
  EXPECT_EQ(open_after[0]->id, before.id);
  EXPECT_EQ(open_after[0]->ranks, before.ranks);
  EXPECT_EQ(open_after[0]->detail, before.detail);
  EXPECT_EQ(open_after[0]->opened_ns, before.opened_ns);
  testing::StoreCommit commit_after{*store};
  Ingest ingest_after(*store, commit_after, clock);
  ASSERT_TRUE(ingest_after.restore());
  CollectiveMatcher matcher_after;
  ingest_after.add_observer(&matcher_after);
  Detector detector_after(ingest_after.model(), matcher_after, restarted, clock, options);
  Finding next;
  next.kind = FindingKind::hang;
  next.comm = kComm;
  next.seq = 99;
  EXPECT_GT(restarted.raise(next, clock.now).id, before.id) << "ids keep increasing after a restart";
}

}  // namespace
}  // namespace rankscope::collector

namespace rankscope::collector {
namespace {

TEST(ProcessHealth, AThrottledCgroupIsNamedAsTheCause) {
  // Two heartbeats 10 s apart: 100 periods of 100 ms, 85 throttled, 8.4 s throttled, 0.15 CPUs.
  ProcessHealth health;
  HealthSample a, b;
  a.sample_ns = 1'000'000'000ull;
  a.cpu_ns = 1'000'000'000ull;
  a.cpu_periods = 1000, a.cpu_throttled_periods = 500, a.cpu_throttled_ns = 40'000'000'000ull;
  a.cpu_quota_millicpus = b.cpu_quota_millicpus = 150;
  b = a;
  b.sample_ns = a.sample_ns + 10 * kSecond;
  b.cpu_ns = a.cpu_ns + 1'500'000'000ull;
  b.cpu_periods = 1100, b.cpu_throttled_periods = 585, b.cpu_throttled_ns = a.cpu_throttled_ns + 8'400'000'000ull;
  health.add(a);
  health.add(b);
  std::string text = health.describe_cpu(10 * kSecond);
  EXPECT_NE(text.find("its cgroup's CPU quota (0.15 CPUs) throttled it in 85% of the quota's periods, 84% of the time"),
            std::string::npos)
      << text;
  // Not throttled in the window: nothing said about a quota.
  ProcessHealth calm;
  b.cpu_throttled_periods = a.cpu_throttled_periods;
  calm.add(a);
  calm.add(b);
  EXPECT_EQ(calm.describe_cpu(10 * kSecond).find("quota"), std::string::npos);
}

}  // namespace
}  // namespace rankscope::collector
