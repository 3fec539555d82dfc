// The detectors fed by the collective matcher alone: a cluster model built
// by hand, records handed to the matcher as the ingest would hand them
// (its progress first), no store, no wire messages.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "collector/detect/detector.h"
#include "collector/detect/findings.h"
#include "collector/match/gpu_matcher.h"
#include "collector/match/matcher.h"
#include "collector/model/cluster.h"
#include "proto/records.h"
#include "tests/support/manual_clock.h"
#include "tests/support/model.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kSecond = 1'000'000'000ull;
constexpr uint64_t kMs = 1'000'000ull;
constexpr uint64_t kComm = 0x5eed0000c0ffee11ull;

class DetectFromMatcherTest : public ::testing::Test {
 protected:
  // `nranks` ranks, two per node, each node's clock exact to 100 ns.
  void start(int32_t nranks) {
    this->nranks = nranks;
    testing::add_comm(model, kComm, nranks, "job-1");
    for (auto& [name, node] : model.nodes) node.last_contact_ns = clock.now;
    options.hang_timeout_ns = 5 * kSecond;
    detector = std::make_unique<Detector>(model, matcher, book, clock, options);
    gpu_matcher.subscribe(*detector);
  }

  // Every rank not in `absent` issues AllReduce #seq at t + delay(rank): the
  // member's progress as the ingest keeps it, then the record to the matcher.
  void instance(uint64_t seq, uint64_t t, const std::function<int64_t(int32_t)>& delay,
                const std::vector<int32_t>& absent = {}) {
    CommState& comm = model.comms.at(kComm);
    for (int32_t r = 0; r < nranks; ++r) {
      if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
      proto::CallRecord call = testing::allreduce(comm.members.at(r), seq, t + static_cast<uint64_t>(delay(r)));
      matcher.on_record(comm, r, 0, call);
    }
  }

  // Every rank's GPU reports AllReduce #seq (NCCL's seqNumber), its kernel
  // starting at t + start(rank); every kernel ends 2 ms after the last one
  // started plus end(rank) (the data moved once all had started; a rank that
  // receives later ends later).
  void gpu_instance(uint64_t seq, uint64_t t, const std::function<int64_t(int32_t)>& start,
                    const std::function<int64_t(int32_t)>& end = [](int32_t) { return 0; }) {
    CommState& comm = model.comms.at(kComm);
    uint64_t last = 0;
    for (int32_t r = 0; r < nranks; ++r) last = std::max(last, t + static_cast<uint64_t>(start(r)));
    for (int32_t r = 0; r < nranks; ++r) {
      const uint64_t begin = t + static_cast<uint64_t>(start(r));
      gpu(comm, r, proto::GpuRecord{seq, 1024, t, begin, last + 2 * kMs + static_cast<uint64_t>(end(r))});
    }
  }

  // A member's GPU record, to its observers in the ingest's order: the GPU matcher, then the detector.
  void gpu(const CommState& comm, int32_t rank, const proto::GpuRecord& record) {
    gpu_matcher.on_gpu(comm, rank, RS_OP_ALLREDUCE, record);
    detector->on_gpu(comm, rank, RS_OP_ALLREDUCE, record);
  }

  void evaluate_at(uint64_t t) {
    clock.now = t;
    for (auto& [name, node] : model.nodes) node.last_contact_ns = t;  // every agent is heard from
    matcher.sweep(model.comms);
    detector->evaluate(t);
  }

  std::vector<const Finding*> open(FindingKind kind) const {
    std::vector<const Finding*> out;
    for (const Finding* f : book.open())
      if (f->kind == kind) out.push_back(f);
    return out;
  }

  ClusterModel model;
  testing::ManualClock clock{1'000 * kSecond};
  CollectiveMatcher matcher;
  GpuMatcher gpu_matcher;
  FindingBook book;
  DetectOptions options;
  std::unique_ptr<Detector> detector;
  int32_t nranks = 0;
};

TEST_F(DetectFromMatcherTest, ARankLateAtEveryCollectiveIsTheOneStraggler) {
  start(4);
  const uint64_t t0 = clock.now;
  uint64_t seq = 0;
  auto step = [&](int64_t late) {
    instance(seq, t0 + seq * 20 * kMs,
             [&](int32_t r) { return (r == 1 ? late : 0) + static_cast<int64_t>((r * 37 + seq * 11) % 300) * 1000; });
    ++seq;
  };
  // On time for a window first (the job's structure is learnt from whole
  // windows), then 10 ms late at every collective.
  const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (20 * kMs);
  for (uint64_t i = 0; i < window_steps; ++i) step(0);
  for (int i = 0; i < 3; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  EXPECT_TRUE(book.open().empty()) << "on time: nothing to say";
  for (uint64_t i = 0; i < window_steps; ++i) step(10 * static_cast<int64_t>(kMs));
  for (int i = 0; i < 3; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001);
  EXPECT_EQ(stragglers[0]->nodes, std::vector<std::string>{"node-0"});
  EXPECT_NE(stragglers[0]->summary.find("straggler in job job-1"), std::string::npos) << stragglers[0]->summary;
}

// With GPU times (NCCL's profiler plugin): a rank that issues on time and
// whose kernels start late is a straggler on the GPU side, and one that
// issues late is one on the host side (its kernels are late because it was).
class GpuSideTest : public DetectFromMatcherTest, public ::testing::WithParamInterface<bool> {};

TEST_P(GpuSideTest, TheSideOfAStragglerIsWhereItsDelayIsAdded) {
  const bool gpu_slow = GetParam();
  start(4);
  const uint64_t t0 = clock.now;
  uint64_t seq = 0;
  auto step = [&](int64_t late) {
    const uint64_t t = t0 + seq * 20 * kMs;
    auto jitter = [&](int32_t r) { return static_cast<int64_t>((r * 37 + seq * 11) % 300) * 1000; };
    const int64_t host_late = gpu_slow ? 0 : late;
    instance(seq, t, [&](int32_t r) { return (r == 1 ? host_late : 0) + jitter(r); });
    // A kernel starts 1 ms after its issue, or after its GPU's extra work.
    gpu_instance(seq, t, [&](int32_t r) { return (r == 1 ? late : 0) + jitter(r) + static_cast<int64_t>(kMs); });
    ++seq;
  };
  const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (20 * kMs);
  for (uint64_t i = 0; i < window_steps; ++i) step(0);
  for (int i = 0; i < 3; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  EXPECT_TRUE(book.open().empty()) << "on time on both sides: nothing to say";
  for (uint64_t i = 0; i < window_steps; ++i) step(10 * static_cast<int64_t>(kMs));
  for (int i = 0; i < 3; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->ranks, std::vector<int32_t>{1});
  EXPECT_NEAR(stragglers[0]->lateness_s, 0.010, 0.001);
  EXPECT_EQ(stragglers[0]->summary.find("(GPU side)") != std::string::npos, gpu_slow) << stragglers[0]->summary;
  EXPECT_EQ(stragglers[0]->detail.find("on its GPU") != std::string::npos, gpu_slow) << stragglers[0]->detail;
  EXPECT_EQ(gpu_matcher.completed(), seq);

  // Back on time on both sides: it resolves.
  for (uint64_t i = 0; i < 3 * window_steps; ++i) {
    step(0);
    if (i % 25 == 0) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns);
  }
  for (int i = 0; i < options.close_after + 1; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  EXPECT_TRUE(open(FindingKind::straggler).empty());
}

INSTANTIATE_TEST_SUITE_P(Side, GpuSideTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? std::string("SlowGpu") : std::string("SlowHost"); });

// A slow link into rank 1 (in a ring, the rank that receives last): its
// kernels of each collective end 4 ms after the others', and its next
// collective's kernels, back to back on its stream, start 4 ms after
// theirs. Its GPU is on time from when it was free to go on: not a
// straggler on the GPU side (seen on an H100, docs/benchmarks.md, before
// kernel starts were judged from the previous kernels' end).
TEST_F(DetectFromMatcherTest, ARankWhoseKernelsStartLateOnlyBecauseItsLastOnesEndedLateIsNotAStraggler) {
  start(4);
  const uint64_t t0 = clock.now;
  uint64_t seq = 0;
  int64_t downstream = 0;  // how much later rank 1's kernels end (from the slow link)
  auto step = [&] {
    const uint64_t t = t0 + seq * 20 * kMs;
    auto jitter = [&](int32_t r) { return static_cast<int64_t>((r * 37 + seq * 11) % 300) * 1000; };
    instance(seq, t, jitter);
    // Each kernel starts as its previous one ended (2 ms after its issue,
    // or later for rank 1 while the link is slow).
    const int64_t late = downstream;
    gpu_instance(
        seq, t, [&](int32_t r) { return (r == 1 ? late : 0) + jitter(r) + static_cast<int64_t>(kMs); },
        [&](int32_t r) { return r == 1 ? downstream : 0; });
    ++seq;
  };
  const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (20 * kMs);
  for (uint64_t i = 0; i < window_steps; ++i) step();
  downstream = 4 * static_cast<int64_t>(kMs);
  for (uint64_t i = 0; i < 2 * window_steps; ++i) {
    step();
    if (i % 25 == 0) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns);
  }
  for (int i = 0; i < 3; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  EXPECT_TRUE(open(FindingKind::straggler).empty()) << open(FindingKind::straggler)[0]->summary;
}

// Tensor and data parallelism on one stream per process (tp-dp): four
// processes, two per node; each step a TP collective inside each node, then
// a DP one across them. Process 3's GPU starts its kernels late. Its TP
// partner's kernels end late with its own, so that partner's next DP kernel,
// queued behind them, starts late on another communicator: it is free to go
// on only then, and is not to blame. Process 3 alone is named.
TEST_F(DetectFromMatcherTest, AKernelHeldBehindAnotherCommunicatorsLateOneIsNotAStraggler) {
  start(4);  // the nodes, their clocks and the four processes; the communicators are made here
  model.comms.clear();
  // {node, pid} of the four processes; each communicator's rank r is its r-th process.
  const std::vector<std::pair<std::string, uint32_t>> procs = {{"node-0", 100}, {"node-0", 101}, {"node-1", 102},
                                                               {"node-1", 103}};
  const std::vector<std::pair<uint64_t, std::vector<int>>> comms = {
      {0x7a00, {0, 1}}, {0x7b00, {2, 3}},   // TP, inside each node
      {0xda00, {0, 2}}, {0xdb00, {1, 3}}};  // DP, across the nodes
  for (const auto& [hash, members] : comms) {
    CommState& comm = testing::add_comm(model, hash, 2, "job-1");
    for (int32_t r = 0; r < 2; ++r) {
      MemberState& m = comm.members.at(r);
      std::tie(m.node, m.pid) = procs[members[r]];
    }
  }
  constexpr int kVictim = 3;
  const uint64_t t0 = clock.now;
  uint64_t seq = 0;
  int64_t late = 0;  // how late the victim's GPU starts its TP kernels
  auto step = [&] {
    const uint64_t t = t0 + seq * 20 * kMs;
    auto jitter = [&](int p) { return static_cast<uint64_t>((p * 37 + seq * 11) % 300) * 1000; };
    std::vector<uint64_t> tp_end(4);
    for (int phase = 0; phase < 2; ++phase)
      for (int c = 2 * phase; c < 2 * phase + 2; ++c) {
        const auto& [hash, members] = comms[c];
        CommState& comm = model.comms.at(hash);
        // Issued on time (TP at t, DP 1 ms later); a TP kernel starts 1 ms
        // after its issue (the victim's later), a DP one 100 us after its
        // process's TP kernel ended.
        std::vector<uint64_t> begin(2);
        for (int32_t r = 0; r < 2; ++r) {
          const int p = members[r];
          const uint64_t issue = t + jitter(p) + (phase ? kMs : 0);
          matcher.on_record(comm, r, 0, testing::allreduce(comm.members.at(r), seq, issue));
          begin[r] = phase ? tp_end[p] + 100'000 : issue + kMs + (p == kVictim ? static_cast<uint64_t>(late) : 0);
        }
        const uint64_t end = std::max(begin[0], begin[1]) + 2 * kMs;
        for (int32_t r = 0; r < 2; ++r) {
          if (!phase) tp_end[members[r]] = end;
          gpu(comm, r, proto::GpuRecord{seq, 1024, t, begin[r], end});
        }
      }
    ++seq;
  };
  const uint64_t window_steps = options.straggler.window_ns * 6 / 5 / (20 * kMs);
  for (uint64_t i = 0; i < window_steps; ++i) step();
  late = 8 * static_cast<int64_t>(kMs);
  for (uint64_t i = 0; i < 2 * window_steps; ++i) {
    step();
    if (i % 25 == 0) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns);
  }
  for (int i = 0; i < 3; ++i) evaluate_at(t0 + seq * 20 * kMs + options.settle_ns + i * kMs);
  auto stragglers = open(FindingKind::straggler);
  ASSERT_FALSE(stragglers.empty()) << "the victim's late GPU is not found";
  for (const Finding* f : stragglers) {
    EXPECT_NE(f->detail.find("(pid 103)"), std::string::npos) << f->summary;
    EXPECT_NE(f->summary.find("(GPU side)"), std::string::npos) << f->summary;
  }
}

// A split child waits to be sized (nranks -1) while its members' records
// come, GPU records included (a sized child's come later): the detector
// takes nothing of it, and does not fall over.
TEST_F(DetectFromMatcherTest, AGpuRecordOfASplitChildNotYetSizedIsTakenForNothing) {
  start(4);
  CommState& child = testing::add_comm(model, 0xc41d0000c41d0000ull, 2, "job-1");
  child.nranks = -1;
  detector->on_gpu(child, 1, RS_OP_ALLREDUCE, proto::GpuRecord{1, 1024, clock.now, clock.now + kMs, clock.now + 2 * kMs});
  detector->on_gpu(child, 7, RS_OP_ALLREDUCE, proto::GpuRecord{1, 1024, clock.now, clock.now + kMs, clock.now + 2 * kMs});
  evaluate_at(clock.now + kSecond);
  EXPECT_TRUE(book.open().empty());
}

TEST_F(DetectFromMatcherTest, ARankThatNeverEntersACollectiveIsNamedInAHangAfterTheTimeout) {
  start(4);
  const uint64_t t0 = clock.now;
  for (uint64_t seq = 0; seq < 10; ++seq) instance(seq, t0 + seq * 20 * kMs, [](int32_t) { return 0; });
  instance(10, t0 + 200 * kMs, [](int32_t) { return 0; }, {3});  // rank 3 never comes
  evaluate_at(t0 + 200 * kMs + options.hang_timeout_ns - kSecond);
  EXPECT_TRUE(open(FindingKind::hang).empty()) << "not before the hang timeout";
  evaluate_at(t0 + 200 * kMs + options.hang_timeout_ns + kSecond);
  auto hangs = open(FindingKind::hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0]->ranks, std::vector<int32_t>{3});
  EXPECT_EQ(hangs[0]->seq, 10);
  EXPECT_TRUE(open(FindingKind::straggler).empty());
}

TEST_F(DetectFromMatcherTest, RanksCallingDifferentCollectivesAreAMismatchNamingTheOddOne) {
  start(4);
  CommState& comm = model.comms.at(kComm);
  for (int32_t r = 0; r < 4; ++r) {
    proto::CallRecord call;
    call.seq = 0;
    call.issue_ns = clock.now + static_cast<uint64_t>(r) * 1000;
    call.return_ns = call.issue_ns + 10'000;
    call.op = r == 2 ? RS_OP_BROADCAST : RS_OP_ALLREDUCE;
    call.datatype = 7;
    call.count = 1024;
    comm.members.at(r).last_seq = 0;
    matcher.on_record(comm, r, 0, call);
  }
  auto mismatches = open(FindingKind::mismatch);
  ASSERT_EQ(mismatches.size(), 1u);
  EXPECT_EQ(mismatches[0]->ranks, std::vector<int32_t>{2});
}

}  // namespace
}  // namespace rankscope::collector
