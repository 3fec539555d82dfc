// fakenccl behaves like NCCL where rankscope depends on it: real rank
// processes, collectives that return at once and complete only when every
// rank has arrived, a stopped rank that stalls the others, a dead rank that
// becomes an async error, and mismatched calls that hang.
//
// Every test starts its ranks as child processes in a fresh temporary folder,
// follows them through their output and marker files (polling with a
// deadline, never sleeping for readiness), and kills and removes everything
// when it ends, pass or fail.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "nccl-profiler/ring.h"
#include "node-agent/identify.h"
#include "node-agent/profiler_rings.h"
#include "proto/records.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr auto kDeadline = 30s;  // for anything that should take well under a second

// --------------------------------------------------------------- helpers --

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "fakenccl_test.XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// Polls `condition` until it holds or `timeout` passes; returns whether it held.
bool waitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout = kDeadline) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The NULL-terminated array execve() wants; valid while `strings` lives.
std::vector<char*> pointersTo(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// One rank: a child process with RANK/WORLD_SIZE set and its stdout and
// stderr in files. Killed and reaped on destruction if still running.
class RankProcess {
 public:
  // `name` tells the output files apart ("stdout.NAME").
  // `extraEnv`: NAME=VALUE entries set for this rank (over the test's own).
  RankProcess(const TempDir& dir, const std::string& name, int rank, int worldSize, std::vector<std::string> argv,
              const std::vector<std::string>& extraEnv = {})
      : stdoutPath_(dir.file("stdout." + name)), stderrPath_(dir.file("stderr." + name)) {
    std::vector<std::string> env = {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(worldSize),
                                    "LOCAL_RANK=" + std::to_string(rank)};
    env.insert(env.end(), extraEnv.begin(), extraEnv.end());
    auto setHere = [&](const std::string& entry) {
      const std::string name = entry.substr(0, entry.find('=') + 1);
      return std::any_of(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(name); });
    };
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (!setHere(entry)) env.push_back(entry);
    }
    // Built before fork(): the child only calls async-signal-safe functions.
    std::vector<char*> argvPointers = pointersTo(argv);
    std::vector<char*> envPointers = pointersTo(env);

    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the test itself dies
      const int out = ::open(stdoutPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(stderrPath_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
      ::execve(argvPointers[0], argvPointers.data(), envPointers.data());
      ::_exit(127);
    }
  }

  ~RankProcess() {
    if (!exitStatus_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
  }
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  std::string out() const { return readFile(stdoutPath_); }
  std::string err() const { return readFile(stderrPath_); }
  void signal(int number) const { ::kill(pid_, number); }
  pid_t pid() const { return pid_; }

  bool running() {
    if (exitStatus_) return false;
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) exitStatus_ = status;
    return !exitStatus_;
  }

  // The exit code once the process has ended by itself within `timeout`;
  // -1 if it is still running, 128 + N if signal N ended it.
  int waitExit(std::chrono::milliseconds timeout = kDeadline) {
    if (!waitFor([&] { return !running(); }, timeout)) return -1;
    return WIFEXITED(*exitStatus_) ? WEXITSTATUS(*exitStatus_) : 128 + WTERMSIG(*exitStatus_);
  }

  // Whether the kernel shows the process stopped (state T in /proc/PID/stat).
  bool stopped() const {
    const std::string stat = readFile("/proc/" + std::to_string(pid_) + "/stat");
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
  }

 private:
  std::string stdoutPath_;
  std::string stderrPath_;
  pid_t pid_ = -1;
  std::optional<int> exitStatus_;
};

std::vector<std::unique_ptr<RankProcess>> launch(const TempDir& dir, int worldSize,
                                                 const std::vector<std::string>& argv) {
  std::vector<std::unique_ptr<RankProcess>> ranks;
  ranks.reserve(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    ranks.push_back(std::make_unique<RankProcess>(dir, std::to_string(rank), rank, worldSize, argv));
  }
  return ranks;
}

// The last "step N done" that fakenccl-train printed; -1 before the first.
int lastStep(const std::string& output) {
  static const std::regex line(R"(step (\d+) done)");
  int last = -1;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    last = std::stoi((*it)[1]);
  }
  return last;
}

// ----------------------------------------------------------------- tests --

TEST(FakeNccl, TrainingRanksAllReduceExactSums) {
  TempDir dir;
  auto ranks = launch(dir, 4, {FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--steps", "30", "--check", "--quiet"});
  for (auto& rank : ranks) {
    EXPECT_EQ(rank->waitExit(), 0) << rank->err();
    EXPECT_NE(rank->out().find("30 steps, 90 NCCL calls"), std::string::npos) << rank->out();
    EXPECT_NE(rank->out().find("check ok"), std::string::npos) << rank->out();
  }
}

// Every --pattern of fakenccl-train on 4 ranks: the calls each rank makes,
// from its --record file (op -> count).
TEST(FakeNccl, EveryTrainingPatternMakesItsCalls) {
  struct Want {
    std::string pattern;
    std::map<std::string, int> calls;  // per rank over 8 steps
  };
  const std::vector<Want> wants = {
      {"ddp", {{"AllReduce", 24}}},
      {"sync-each", {{"AllReduce", 24}}},
      {"jitter", {{"AllReduce", 24}}},
      {"accum", {{"AllReduce", 6}}},  // 3 buckets every 4th step
      {"fsdp", {{"AllGather", 800}, {"ReduceScatter", 800}}},
      // 2 stages x 2 replicas, 4 micro-batches: each rank sends and receives
      // 4 a step; the stage's buckets across replicas and one over all ranks.
      {"pipeline", {{"Send", 32}, {"Recv", 32}, {"AllReduce", 32}, {"CommSplit", 1}}},
      // 2 x 4 layers inside the group, 3 buckets across groups.
      {"tp-dp", {{"AllReduce", 88}, {"CommSplit", 2}}},
  };
  for (const auto& want : wants) {
    SCOPED_TRACE(want.pattern);
    TempDir dir;
    std::vector<std::unique_ptr<RankProcess>> ranks;
    for (int rank = 0; rank < 4; ++rank)
      ranks.push_back(std::make_unique<RankProcess>(
          dir, std::to_string(rank), rank, 4,
          std::vector<std::string>{FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--pattern", want.pattern, "--steps",
                                   "8", "--compute-iters", "20000", "--record", dir.file("calls." + std::to_string(rank)),
                                   "--quiet"}));
    for (int rank = 0; rank < 4; ++rank) {
      ASSERT_EQ(ranks[rank]->waitExit(), 0) << ranks[rank]->err();
      std::map<std::string, int> made;
      std::istringstream lines(readFile(dir.file("calls." + std::to_string(rank))));
      std::string index, op, rest;
      while (lines >> index >> op && std::getline(lines, rest)) made[op] += 1;
      for (const auto& [op, count] : want.calls) EXPECT_EQ(made[op], count) << op << " on rank " << rank;
    }
  }
}

TEST(FakeNccl, SelftestPassesOnFourRanks) {
  TempDir dir;
  auto ranks = launch(dir, 4, {FAKENCCL_SELFTEST, "--id-file", dir.file("id")});
  for (auto& rank : ranks) {
    EXPECT_EQ(rank->waitExit(), 0) << rank->out() << rank->err();
    EXPECT_NE(rank->out().find(", 0 failed"), std::string::npos) << rank->out();
  }
}

// The order is forced, not timed: rank 1 may call ncclAllReduce only after
// the test has seen rank 0 return from its own call.
TEST(FakeNccl, CollectiveReturnsBeforePeersArriveAndSyncWaitsForThem) {
  TempDir dir;
  auto ranks = launch(dir, 2, {FAKENCCL_PROBE, "--mode", "order", "--dir", dir.path().string()});
  const std::string enqueued = dir.file("enqueued");
  ASSERT_TRUE(waitFor([&] { return fs::exists(enqueued); }))
      << "ncclAllReduce did not return while its peer had not called it\n"
      << ranks[0]->err();
  EXPECT_EQ(readFile(enqueued), "stream busy") << "the stream finished before the peer arrived";
  EXPECT_TRUE(ranks[0]->running()) << "rank 0 finished before its peer arrived\n" << ranks[0]->out();

  std::ofstream(dir.file("release")).close();
  EXPECT_EQ(ranks[0]->waitExit(), 0) << ranks[0]->out() << ranks[0]->err();
  EXPECT_EQ(ranks[1]->waitExit(), 0) << ranks[1]->err();
  EXPECT_NE(ranks[0]->out().find("synchronize returned after the peer was released"), std::string::npos)
      << ranks[0]->out();
}

// While a rank is stopped, the others can finish at most the step its
// stream may already have fed (one past its last printed step), however long
// the test watches; after SIGCONT everyone completes with correct sums.
TEST(FakeNccl, StoppedRankBlocksOthersUntilContinued) {
  TempDir dir;
  auto ranks = launch(dir, 3,
                      {FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--steps", "200", "--compute-iters", "200000",
                       "--bucket-elems", "4096", "--check"});
  RankProcess& victim = *ranks[1];
  ASSERT_TRUE(waitFor([&] { return lastStep(victim.out()) >= 3; })) << victim.err();
  victim.signal(SIGSTOP);
  ASSERT_TRUE(waitFor([&] { return victim.stopped(); }));
  const int victimStep = lastStep(victim.out());
  ASSERT_LT(victimStep, 199) << "the run ended before the rank could be stopped";

  // An observation window, not a readiness wait: the bound holds however
  // long it is, and longer only makes the test stricter.
  std::this_thread::sleep_for(500ms);
  for (int r : {0, 2}) {
    EXPECT_TRUE(ranks[r]->running());
    EXPECT_LE(lastStep(ranks[r]->out()), victimStep + 1) << "rank " << r << " progressed while rank 1 was stopped";
  }

  victim.signal(SIGCONT);
  for (auto& rank : ranks) {
    EXPECT_EQ(rank->waitExit(), 0) << rank->err();
    EXPECT_NE(rank->out().find("200 steps, 600 NCCL calls"), std::string::npos);
    EXPECT_NE(rank->out().find("check ok"), std::string::npos);
  }
}

TEST(FakeNccl, MismatchedCollectiveIsReportedAndHangs) {
  TempDir dir;
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> argv = {FAKENCCL_TRAIN,
                                     "--id-file",
                                     dir.file("id"),
                                     "--steps",
                                     "10",
                                     "--compute-iters",
                                     "0",
                                     "--record",
                                     dir.file("record." + std::to_string(rank))};
    if (rank == 1) argv.insert(argv.end(), {"--mismatch-at-step", "2"});
    ranks.push_back(std::make_unique<RankProcess>(dir, std::to_string(rank), rank, 2, argv));
  }
  auto reported = [&] {
    return ranks[0]->err().find("collective mismatch at op #6") != std::string::npos ||
           ranks[1]->err().find("collective mismatch at op #6") != std::string::npos;
  };
  ASSERT_TRUE(waitFor(reported)) << ranks[0]->err() << ranks[1]->err();
  const std::string both = ranks[0]->err() + ranks[1]->err();
  EXPECT_NE(both.find("hanging as NCCL would"), std::string::npos) << both;
  EXPECT_TRUE(ranks[0]->running() && ranks[1]->running()) << "a rank went past the mismatch";
  // The record shows what the rank called, in order: at step 2, op #6.
  EXPECT_NE(readFile(dir.file("record.1")).find("7 AllGather 65536 float32 262144"), std::string::npos)
      << readFile(dir.file("record.1"));
}

TEST(FakeNccl, DeadPeerBecomesRemoteErrorAndAbortFreesTheStream) {
  TempDir dir;
  auto ranks = launch(dir, 2, {FAKENCCL_PROBE, "--mode", "peer-death", "--dir", dir.path().string()});
  ASSERT_TRUE(waitFor([&] { return fs::exists(dir.file("ready.0")) && fs::exists(dir.file("ready.1")); }))
      << ranks[0]->err() << ranks[1]->err();
  ranks[1]->signal(SIGKILL);
  EXPECT_EQ(ranks[0]->waitExit(), 0) << ranks[0]->out() << ranks[0]->err();
  EXPECT_NE(ranks[0]->out().find("async error ncclRemoteError, stream blocked until ncclCommAbort"), std::string::npos)
      << ranks[0]->out();
}

// Rank 0 holds back, so the rendezvous cannot complete while the two claims
// to rank 1 arrive: the second must be refused, and the root must keep
// waiting for rank 0 rather than give up.
TEST(FakeNccl, DuplicateRankIsRefusedAndTheOthersStillMeet) {
  TempDir dir;
  const std::vector<std::string> argv = {FAKENCCL_PROBE, "--mode", "duplicate", "--dir", dir.path().string()};
  RankProcess rank0(dir, "0", 0, 2, argv);
  RankProcess claimA(dir, "1a", 1, 2, argv);
  RankProcess claimB(dir, "1b", 1, 2, argv);
  ASSERT_TRUE(waitFor([&] { return !claimA.running() || !claimB.running(); }));
  const bool refusedA = !claimA.running();
  RankProcess& refused = refusedA ? claimA : claimB;
  RankProcess& accepted = refusedA ? claimB : claimA;
  EXPECT_EQ(refused.waitExit(), 4) << refused.out() << refused.err();
  EXPECT_NE(refused.err().find("duplicate rank"), std::string::npos) << refused.err();

  std::ofstream(dir.file("go")).close();
  EXPECT_EQ(rank0.waitExit(), 0) << rank0.err();
  EXPECT_EQ(accepted.waitExit(), 0) << accepted.err();
}

// What the test keeps of a ring record (a Record holds its slot's atomic sequence).
struct Seen {
  rankscope::profiler::RecordKind kind;
  uint8_t op;
  uint64_t comm_hash, seq_number, gpu_ns;
  int32_t rank;
};

// A rank's profiler ring, read as the node agent reads it: mapped, checked,
// and marked read (until then the plugin only counts what it drops).
class RingTap {
 public:
  explicit RingTap(pid_t pid) : pid_(static_cast<uint32_t>(pid)) {}
  ~RingTap() { rankscope::profiler::unmap_ring(ring_); }
  // Maps the ring once the process has made it (at its first communicator;
  // a ring still being made is looked at again).
  bool open() {
    std::string why;
    auto start = rankscope::agent::read_start_time("/proc", pid_);
    if (!start) return false;
    bool unfinished = false;
    auto ring = rankscope::profiler::map_process_ring("/proc", pid_, *start, why, &unfinished);
    if (unfinished) return false;
    EXPECT_EQ(why, "");
    if (!ring) return false;
    ring_ = *ring;
    ring_.header->reader.store(static_cast<uint32_t>(::getpid()));
    return true;
  }
  void drain(std::vector<Seen>& out) {
    rankscope::profiler::Record r;
    while (rankscope::profiler::ring_read(ring_, r))
      out.push_back({r.kind, r.op, r.comm_hash, r.seq_number, r.gpu_ns, r.rank});
  }

 private:
  uint32_t pid_;
  rankscope::profiler::RingView ring_;
};

// NCCL_PROFILER_PLUGIN names rankscope's plugin: fakenccl loads it as NCCL
// does and reports every collective as it is enqueued, with NCCL's commHash
// (that of the unique id, as the agent computes it) and seqNumber, and its
// kernel with GPU times. Rank 1's GPU is slow (FAKECUDA_GPU_DELAY_US): it
// issues on time, and only its kernels start late.
TEST(FakeNccl, TheProfilerPluginHearsEachCollectiveAndItsKernelWithGpuTimes) {
  TempDir dir;
  constexpr int64_t kDelayUs = 20'000;
  const std::vector<std::string> argv = {FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--steps", "1000000",
                                         "--buckets", "1", "--compute-iters", "1000", "--quiet"};
  const std::string plugin = std::string("NCCL_PROFILER_PLUGIN=") + RANKSCOPE_PROFILER_PLUGIN;
  RankProcess rank0(dir, "0", 0, 2, argv, {plugin});
  RankProcess rank1(dir, "1", 1, 2, argv, {plugin, "FAKECUDA_GPU_DELAY_US=" + std::to_string(kDelayUs)});
  RingTap taps[2] = {RingTap(rank0.pid()), RingTap(rank1.pid())};
  for (RingTap& tap : taps) ASSERT_TRUE(waitFor([&] { return tap.open(); })) << rank0.err() << rank1.err();

  // Records until each rank has 20 AllReduce kernels that stopped.
  std::vector<Seen> records[2];
  auto stopped = [&](int r) {
    return std::count_if(records[r].begin(), records[r].end(), [](const auto& x) {
      return x.kind == rankscope::profiler::RecordKind::kernel_stop && x.op == RS_OP_ALLREDUCE;
    });
  };
  ASSERT_TRUE(waitFor([&] {
    taps[0].drain(records[0]);
    taps[1].drain(records[1]);
    return stopped(0) >= 20 && stopped(1) >= 20;
  })) << rank0.err() << rank1.err();

  char id[128];
  std::ifstream(dir.file("id"), std::ios::binary).read(id, sizeof(id));
  const uint64_t hash = rankscope::proto::comm_hash_of_unique_id(reinterpret_cast<const uint8_t*>(id), sizeof(id));
  std::map<uint64_t, uint64_t> kernel_start[2];  // AllReduce seqNumber -> GPU time its kernel started
  for (int r = 0; r < 2; ++r) {
    std::optional<uint64_t> last;
    std::map<uint32_t, uint64_t> started;  // kernel event -> GPU start
    for (const auto& x : records[r]) {
      EXPECT_EQ(x.comm_hash, hash) << "rank " << r;
      EXPECT_EQ(x.rank, r);
      if (x.op != RS_OP_ALLREDUCE) continue;
      if (x.kind == rankscope::profiler::RecordKind::coll_start) {
        if (last) {
          EXPECT_EQ(x.seq_number, *last + 1) << "NCCL's seqNumber counts each function's collectives";
        }
        last = x.seq_number;
      } else if (x.kind == rankscope::profiler::RecordKind::kernel_start) {
        EXPECT_GT(x.gpu_ns, 0u);
        kernel_start[r][x.seq_number] = x.gpu_ns;
      } else if (x.kind == rankscope::profiler::RecordKind::kernel_stop) {
        if (kernel_start[r].count(x.seq_number)) {
          EXPECT_GE(x.gpu_ns, kernel_start[r][x.seq_number]) << "a kernel stops after it starts";
        }
      }
    }
    EXPECT_TRUE(last.has_value()) << "no AllReduce was reported enqueued by rank " << r;
  }
  // The slow GPU: rank 1's kernels start later than rank 0's, by about the delay.
  std::vector<int64_t> lag;
  for (const auto& [seq, start] : kernel_start[1])
    if (kernel_start[0].count(seq)) lag.push_back(static_cast<int64_t>(start - kernel_start[0][seq]));
  ASSERT_GE(lag.size(), 10u);
  std::nth_element(lag.begin(), lag.begin() + lag.size() / 2, lag.end());
  EXPECT_GE(lag[lag.size() / 2], kDelayUs * 1000 / 2) << "rank 1's kernels do not start late";
}

// The agent's reader attached to every rank's ring, once each has made it.
bool attachAll(rankscope::agent::ProfilerRings& rings, std::span<const pid_t> pids) {
  return waitFor([&] {
    bool all = true;
    for (pid_t pid : pids) {
      auto start = rankscope::agent::read_start_time("/proc", static_cast<uint32_t>(pid));
      all = all && start && rings.attach(static_cast<uint32_t>(pid), *start);
    }
    return all;
  });
}

// The agent's reader (node-agent/profiler_rings.h) on the same job: one
// record per AllReduce and rank, its kernel's times put on the host's
// monotonic clock from the GPU's (the wall clock here). The slow GPU's
// kernels start the delay after NCCL enqueued them; the other's at once.
TEST(FakeNccl, TheAgentReadsEachRanksGpuTimesOnTheHostClock) {
  TempDir dir;
  constexpr uint64_t kDelayNs = 20'000'000;
  const std::vector<std::string> argv = {FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--steps", "1000000",
                                         "--buckets", "1", "--compute-iters", "1000", "--quiet"};
  const std::string plugin = std::string("NCCL_PROFILER_PLUGIN=") + RANKSCOPE_PROFILER_PLUGIN;
  RankProcess rank0(dir, "0", 0, 2, argv, {plugin});
  RankProcess rank1(dir, "1", 1, 2, argv, {plugin, "FAKECUDA_GPU_DELAY_US=" + std::to_string(kDelayNs / 1000)});
  rankscope::agent::ProfilerRings rings;
  const pid_t pids[2] = {rank0.pid(), rank1.pid()};
  ASSERT_TRUE(attachAll(rings, pids)) << rank0.err() << rank1.err();
  std::map<uint32_t, std::vector<rankscope::agent::GpuCollective>> got;
  ASSERT_TRUE(waitFor([&] {
    rings.drain([&](const rankscope::agent::GpuCollective& c) { got[c.pid].push_back(c); });
    return got[pids[0]].size() >= 20 && got[pids[1]].size() >= 20;
  })) << rank0.err() << rank1.err();
  std::vector<int64_t> waited[2];  // kernel start - enqueue, per rank
  for (int r = 0; r < 2; ++r) {
    std::optional<uint64_t> last;
    for (const auto& c : got[pids[r]]) {
      EXPECT_EQ(c.rank, r);
      EXPECT_EQ(c.op, RS_OP_ALLREDUCE);
      if (last) {
        EXPECT_EQ(c.seq_number, *last + 1) << "each collective once, in order";
      }
      last = c.seq_number;
      ASSERT_NE(c.enqueued_ns, 0u);
      EXPECT_GE(c.kernel_end_ns, c.kernel_start_ns);
      EXPECT_EQ(c.link_peer, -1) << "no proxy steps unless the agent asks for them";
      waited[r].push_back(static_cast<int64_t>(c.kernel_start_ns - c.enqueued_ns));
    }
    std::nth_element(waited[r].begin(), waited[r].begin() + waited[r].size() / 2, waited[r].end());
  }
  const int64_t median0 = waited[0][waited[0].size() / 2], median1 = waited[1][waited[1].size() / 2];
  EXPECT_GE(median1, static_cast<int64_t>(kDelayNs)) << "the slow GPU's kernels start the delay after their enqueue";
  EXPECT_LT(median0, static_cast<int64_t>(kDelayNs) / 2) << "a healthy GPU's start at once";
  EXPECT_GE(median0, 0) << "no kernel starts before NCCL enqueued it, on the host clock";
}

// Another profiler plugin beside rankscope's (NCCL loads one per process):
// RANKSCOPE_NCCL_PROFILER_CHAIN names it, and it hears, through rankscope's,
// each collective and kernel as NCCL would have told it alone, while the
// agent reads rankscope's ring as usual. A chain that cannot be used (a
// missing file; rankscope's own plugin) is said through NCCL's logger
// (NCCL_DEBUG=WARN), and the job runs.
TEST(FakeNccl, AChainedProfilerPluginHearsEveryCollectiveBesideTheAgent) {
  TempDir dir;
  constexpr int kSteps = 60;
  const std::vector<std::string> argv = {FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--steps",
                                         std::to_string(kSteps), "--buckets", "1", "--compute-iters", "1000", "--quiet"};
  const std::vector<std::string> env = {std::string("NCCL_PROFILER_PLUGIN=") + RANKSCOPE_PROFILER_PLUGIN,
                                        std::string("RANKSCOPE_NCCL_PROFILER_CHAIN=") + RANKSCOPE_TEST_CHAINED_PLUGIN,
                                        "RANKSCOPE_TEST_CHAIN_LOG=" + dir.file("chain.log"), "NCCL_DEBUG=INFO"};
  RankProcess rank0(dir, "0", 0, 2, argv, env);
  RankProcess rank1(dir, "1", 1, 2, argv, env);
  rankscope::agent::ProfilerRings rings;
  const pid_t pids[2] = {rank0.pid(), rank1.pid()};
  ASSERT_TRUE(attachAll(rings, pids)) << rank0.err() << rank1.err();
  std::map<uint32_t, size_t> got;
  auto drain = [&] { rings.drain([&](const rankscope::agent::GpuCollective& c) { ++got[c.pid]; }); };
  ASSERT_TRUE(waitFor([&] {
    drain();
    return !rank0.running() && !rank1.running();
  })) << rank0.err() << rank1.err();
  EXPECT_EQ(rank0.waitExit(), 0) << rank0.err();
  EXPECT_EQ(rank1.waitExit(), 0) << rank1.err();
  for (pid_t pid : pids) rings.detach(static_cast<uint32_t>(pid), [&](const auto& c) { ++got[c.pid]; });
  for (pid_t pid : pids) EXPECT_GE(got[static_cast<uint32_t>(pid)], 20u) << "the agent read rankscope's ring";

  std::istringstream log(readFile(dir.file("chain.log")));
  int lines = 0;
  for (std::string line; std::getline(log, line); ++lines) {
    std::map<std::string, int> n;
    std::istringstream fields(line);
    for (std::string field; fields >> field;) n[field.substr(0, field.find('='))] = std::stoi(field.substr(field.find('=') + 1));
    EXPECT_EQ(n["inits"], 1) << line;
    EXPECT_GE(n["colls"], kSteps) << line;
    EXPECT_EQ(n["kernels"], n["colls"]) << "every collective's kernel, under it: " << line;
    EXPECT_EQ(n["kernel_stops"], n["kernels"]) << line;
    EXPECT_EQ(n["stops"], n["colls"] + n["kernels"]) << line;
    EXPECT_EQ(n["others"], 0) << "only what it asked for: " << line;
    EXPECT_EQ(n["foreign"], 0) << "its own handles and parents only: " << line;
  }
  EXPECT_EQ(lines, 2) << "one line per rank at its last finalize";
  EXPECT_NE(rank0.err().find("chaining to " + std::string(RANKSCOPE_TEST_CHAINED_PLUGIN)), std::string::npos)
      << rank0.err();

  for (const std::string& chain : {dir.file("missing.so"), std::string(RANKSCOPE_PROFILER_PLUGIN)}) {
    TempDir again;
    std::vector<std::string> args = argv;
    args[2] = again.file("id");
    const std::vector<std::string> bad = {std::string("NCCL_PROFILER_PLUGIN=") + RANKSCOPE_PROFILER_PLUGIN,
                                          "RANKSCOPE_NCCL_PROFILER_CHAIN=" + chain, "NCCL_DEBUG=WARN"};
    RankProcess a(again, "0", 0, 2, args, bad);
    RankProcess b(again, "1", 1, 2, args, bad);
    EXPECT_EQ(a.waitExit(), 0) << a.err();
    EXPECT_EQ(b.waitExit(), 0) << b.err();
    EXPECT_NE(a.err().find("not chaining to " + chain), std::string::npos) << a.err();
  }
}

// NCCL's proxy steps, asked for by the agent (detail): each rank's record of
// a collective names its send link that waited longest on the network.
// Rank 1's link to rank 2 holds each segment 10 ms (a slow link); every
// other link, rank 1's to rank 0 too, moves at once.
TEST(FakeNccl, TheAgentReadsWhichLinkIsSlowFromTheProxySteps) {
  TempDir dir;
  constexpr uint64_t kDelayNs = 10'000'000;
  const std::vector<std::string> argv = {FAKENCCL_TRAIN, "--id-file", dir.file("id"), "--steps", "1000000",
                                         "--buckets", "1", "--compute-iters", "1000", "--quiet"};
  const std::string plugin = std::string("NCCL_PROFILER_PLUGIN=") + RANKSCOPE_PROFILER_PLUGIN;
  RankProcess rank0(dir, "0", 0, 3, argv, {plugin});
  RankProcess rank1(dir, "1", 1, 3, argv,
                    {plugin, "FAKECUDA_LINK_DELAY_US=" + std::to_string(kDelayNs / 1000), "FAKECUDA_LINK_PEER=2"});
  RankProcess rank2(dir, "2", 2, 3, argv, {plugin});
  rankscope::agent::ProfilerRings rings;
  rings.set_detail(true);
  const pid_t pids[3] = {rank0.pid(), rank1.pid(), rank2.pid()};
  ASSERT_TRUE(attachAll(rings, pids)) << rank0.err() << rank1.err() << rank2.err();
  std::map<uint32_t, std::vector<rankscope::agent::GpuCollective>> got;  // those with link waits
  ASSERT_TRUE(waitFor([&] {
    rings.drain([&](const rankscope::agent::GpuCollective& c) {
      if (c.link_peer >= 0) got[c.pid].push_back(c);
    });
    return got[pids[0]].size() >= 20 && got[pids[1]].size() >= 20 && got[pids[2]].size() >= 20;
  })) << rank0.err() << rank1.err() << rank2.err();
  uint64_t median[3];
  for (int r = 0; r < 3; ++r) {
    std::vector<uint64_t> waits;
    for (const auto& c : got[pids[r]]) {
      EXPECT_NE(c.link_peer, r) << "a rank's link leads to another rank";
      if (r == 1) {
        EXPECT_EQ(c.link_peer, 2) << "rank 1's slowest link is its link to rank 2";
      }
      waits.push_back(c.link_wait_ns);
    }
    std::nth_element(waits.begin(), waits.begin() + waits.size() / 2, waits.end());
    median[r] = waits[waits.size() / 2];
  }
  EXPECT_GE(median[1], kDelayNs) << "the slow link's transfers wait the delay on the network";
  EXPECT_LT(median[0], kDelayNs / 4) << "the healthy links' do not";
  EXPECT_LT(median[2], kDelayNs / 4);
}

}  // namespace
