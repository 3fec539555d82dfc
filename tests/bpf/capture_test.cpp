// What the agent captures, for real: rankscope-capture-child runs NCCL
// programs (on the fakenccl stand-ins, real processes and sockets) inside a
// cgroup made by the test; the agent's real BPF probes, scoped to that
// cgroup, feed the agent's real Summariser, and the test reads the batch and
// heartbeat it would send.
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <nccl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "node-agent/attach.h"
#include "node-agent/discover.h"
#include "node-agent/drain.h"
#include "node-agent/host.h"
#include "node-agent/identify.h"
#include "node-agent/summarise.h"
#include "proto/codec.h"
#include "tests/support/harness.h"
#include "tests/support/manual_clock.h"

namespace rankscope::testing {
namespace {

namespace wire = ::rankscope::proto::wire;
using agent::Event;
using agent::NcclProbes;

const std::string kFakeNccl = std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2";
const std::string kFakeCudart = std::string(RANKSCOPE_FAKENCCL_DIR) + "/libcudart.so.13";

// The agent's pipeline minus the transport, scoped to one cgroup.
class Tracer {
 public:
  Tracer(const std::string& cgroup, bool multi_uprobes, std::optional<agent::Scope::UserShares> shares = std::nullopt)
      : summariser_("/proc", "capture-test", testing::unshifted_node_clock()) {
    agent::Options options;
    options.cgroup = cgroup;
    auto scope = agent::resolve_scope(options);
    if (!scope) {
      error_ = scope.error().message;
      return;
    }
    if (shares) scope->shares = *shares;
    auto probes = NcclProbes::open(
        *scope,
        [this](const void* data, size_t size) {
          auto event = agent::decode_event(data, size);
          if (!event) {
            ++malformed_;
            return;
          }
          if (keep_events_) events_.push_back(*event);
          summariser_.on_event(*event);
        },
        true, multi_uprobes);
    if (!probes) {
      error_ = probes.error().message;
      return;
    }
    probes_ = std::move(*probes);
    std::vector<std::string> libraries = {kFakeNccl, kFakeCudart};
    for (const auto& path : agent::Discovery::standard_locations())
      if (agent::library_kind_of(path) == agent::LibraryKind::libc && access(path.c_str(), R_OK) == 0) {
        libraries.push_back(path);
        break;
      }
    for (const auto& path : libraries) {
      auto library = agent::Discovery::from_path(path);
      if (!library) {
        error_ = path + " is missing";
        return;
      }
      auto attached = probes_->attach(*library);
      if (!attached) {
        error_ = attached.error().message;
        return;
      }
    }
  }
  const std::string& error() const { return error_; }
  NcclProbes& probes() { return *probes_; }
  agent::Summariser& summariser() { return summariser_; }
  const std::vector<Event>& events() const { return events_; }
  void keep_events(bool keep) { keep_events_ = keep; }
  size_t malformed() const { return malformed_; }

  bool pump_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    return wait_for(
        [&] {
          probes_->poll(10);
          return done();
        },
        timeout);
  }
  template <typename T>
  std::vector<T> of(pid_t pid) const {
    std::vector<T> out;
    for (const auto& event : events_)
      if (auto* e = std::get_if<T>(&event); e && e->hdr.pid == static_cast<uint32_t>(pid)) out.push_back(*e);
    return out;
  }
  // What the agent would send now, read back from its wire form.
  wire::Batch::Reader batch() {
    message_ = std::make_unique<capnp::MallocMessageBuilder>();
    auto built = message_->initRoot<wire::AgentMessage>().initBatch();
    summariser_.fill(built, DropCounts{});
    return message_->getRoot<wire::AgentMessage>().asReader().getBatch();
  }

 private:
  std::string error_;
  std::unique_ptr<NcclProbes> probes_;
  agent::Summariser summariser_;
  std::vector<Event> events_;
  size_t malformed_ = 0;
  bool keep_events_ = true;
  std::unique_ptr<capnp::MallocMessageBuilder> message_;
};

// The test's cgroup (the agent's scope), children placed in it at start.
class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs and making cgroups need root: run the suite as root";
    struct stat st {};
    ASSERT_EQ(stat((cgroup2_root() + "/cgroup.procs").c_str(), &st), 0) << "no cgroup v2 at " << cgroup2_root();
    top_ = unique_name("rankscope-capture-");
    scope_ = tree_.make(top_);
    tracer_ = std::make_unique<Tracer>(scope_, multi_uprobes());
    ASSERT_EQ(tracer_->error(), "");
  }
  // Starts the child in cgroup `sub` below the scope (created on demand).
  // With hold, it waits for release_children() before it exits.
  Process child(const std::vector<std::string>& args, const std::string& sub = "ranks",
                std::map<std::string, std::string> env = {}, const std::string& prefix = "", bool hold = true) {
    std::string cgroup = tree_.make(top_ + "/" + sub);
    std::string command = "echo $$ > '" + cgroup + "/cgroup.procs' && exec " + prefix + " '" +
                          bin_path("rankscope-capture-child") + "'";
    for (const auto& a : args) command += " '" + a + "'";
    SpawnOptions spawn;
    spawn.argv = {"/bin/sh", "-c", command};
    if (hold) env["CAPTURE_HOLD"] = dir_.file("exit");
    spawn.env = env;
    spawn.stdout_path = dir_.file("child-" + std::to_string(children_++) + ".log");
    return Process(spawn);
  }
  // A folder other users' processes can write in (the test's own is root's
  // alone: they may pass through it, not list it); "" if it could not be made.
  std::string make_open_dir() {
    const std::string open = dir_.file("open");
    if (chmod(dir_.path().c_str(), 0711) != 0 || mkdir(open.c_str(), 0777) != 0 || chmod(open.c_str(), 0777) != 0)
      return "";
    return open;
  }
  void release_children() {
    FILE* f = std::fopen(dir_.file("exit").c_str(), "w");
    if (f) std::fclose(f);
  }
  std::string logs() const {
    std::string out;
    for (int i = 0; i < children_; ++i) out += slurp(dir_.file("child-" + std::to_string(i) + ".log"));
    return out;
  }

  // The uprobes as one multi-uprobe link per program and library where the
  // kernel has them (the agent's default), or one perf event each.
  virtual bool multi_uprobes() const { return true; }
  void three_collectives_in_one_group();

  TempDir dir_;
  CgroupTree tree_;
  std::string top_, scope_;
  std::unique_ptr<Tracer> tracer_;
  int children_ = 0;
};

// The same, its uprobes attached one by one (kernels before 6.6, or
// --multi-uprobes=0).
class CaptureOneByOne : public CaptureTest {
 protected:
  bool multi_uprobes() const override { return false; }
};

// Linux 6.6 or later (multi-uprobe links).
bool kernel_has_multi_uprobes() {
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 6 || (major == 6 && minor >= 6);
}

std::vector<proto::ColumnBlock> blocks_of(wire::Batch::Reader batch) {
  std::vector<proto::ColumnBlock> out;
  for (auto columns : batch.getCollectives()) {
    auto block = proto::decode_columns(columns, batch);
    EXPECT_TRUE(block) << block.error().message;
    if (block) out.push_back(*block);
  }
  return out;
}

void CaptureTest::three_collectives_in_one_group() {
  Process p = child({"group"});
  ASSERT_TRUE(tracer_->pump_until([&] { return tracer_->of<rs_call_event>(p.pid()).size() >= 4; },
                                  std::chrono::seconds(20)))
      << logs();
  auto calls = tracer_->of<rs_call_event>(p.pid());
  ASSERT_EQ(calls.size(), 4u);
  std::vector<uint8_t> ops;
  for (const auto& c : calls) ops.push_back(c.op);
  EXPECT_EQ(ops, (std::vector<uint8_t>{RS_OP_ALLREDUCE, RS_OP_ALLGATHER, RS_OP_BROADCAST, RS_OP_ALLREDUCE}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(calls[i].flags & RS_CALL_IN_GROUP) << "call " << i;
    EXPECT_EQ(calls[i].group_id, calls[0].group_id);
    EXPECT_EQ(calls[i].result, ncclSuccess);
  }
  EXPECT_FALSE(calls[3].flags & RS_CALL_IN_GROUP) << "the call after GroupEnd is outside the group";
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(calls[i].seq, i);

  // On the wire: one block, the group flag kept per record.
  auto blocks = blocks_of(tracer_->batch());
  ASSERT_EQ(blocks.size(), 1u);
  ASSERT_EQ(blocks[0].records.size(), 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(static_cast<bool>(blocks[0].records[i].flags & RS_CALL_IN_GROUP), i < 3) << "record " << i;
  release_children();
  EXPECT_EQ(p.wait(std::chrono::seconds(20)), 0) << logs();
}

TEST_F(CaptureTest, ThreeCollectivesInOneGroupAreMarkedAsOneGroup) {
  EXPECT_EQ(tracer_->probes().multi_uprobes(), kernel_has_multi_uprobes());
  three_collectives_in_one_group();
}

TEST_F(CaptureOneByOne, ThreeCollectivesInOneGroupAreMarkedAsOneGroup) {
  EXPECT_FALSE(tracer_->probes().multi_uprobes());
  three_collectives_in_one_group();
}

// Sequence numbers are per communicator, whichever thread calls it: a
// thread remembers the last few communicators it called (bpf/nccl.bpf.c),
// and neither another thread's calls, nor more communicators than it
// remembers, nor one destroyed and another made in its place may shift them.
TEST_F(CaptureTest, EachCommunicatorIsNumberedInCallOrderAcrossThreadsAndManyCommunicators) {
  Process p = child({"rotate"});
  // 3 calls on the first communicator, 2 rounds over 6, then 2 more.
  constexpr size_t kCalls = 3 + 2 * 6 + 2;
  ASSERT_TRUE(tracer_->pump_until([&] { return tracer_->of<rs_call_event>(p.pid()).size() >= kCalls; },
                                  std::chrono::seconds(20)))
      << logs();
  auto calls = tracer_->of<rs_call_event>(p.pid());
  ASSERT_EQ(calls.size(), kCalls);
  std::vector<uint64_t> comms;  // in order of first call
  std::map<uint64_t, std::vector<uint64_t>> seqs;
  for (const auto& c : calls) {
    EXPECT_FALSE(c.flags & RS_CALL_UNKNOWN_COMM) << "every communicator was created while traced";
    if (!seqs.count(c.comm)) comms.push_back(c.comm);
    seqs[c.comm].push_back(c.seq);
  }
  // The first communicator: 3 calls (two threads), 2 in the rounds, 1 last.
  EXPECT_EQ(seqs[comms[0]], (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_NE(calls[0].hdr.tid, calls[1].hdr.tid) << "the second call is made by another thread";
  // The other five: 2 calls each in the rounds.
  ASSERT_GE(comms.size(), 6u);
  for (size_t i = 1; i < 6; ++i) {
    std::vector<uint64_t> want{0, 1};
    // The communicator made after the second was destroyed may have its
    // address: then its call restarts the numbering there.
    if (comms.size() == 6 && i == 1) want.push_back(0);
    EXPECT_EQ(seqs[comms[i]], want) << "communicator " << i;
  }
  if (comms.size() == 7) {
    EXPECT_EQ(seqs[comms[6]], (std::vector<uint64_t>{0})) << "the new communicator";
  }
  release_children();
  EXPECT_EQ(p.wait(std::chrono::seconds(20)), 0) << logs();
}

TEST_F(CaptureTest, SplitChildrenCarryTheSameHashOnEveryMember) {
  constexpr int kRanks = 4;
  std::vector<Process> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.push_back(child({"split", std::to_string(r), std::to_string(kRanks), dir_.file("split.id")}));
  auto splits_seen = [&] {
    int n = 0;
    for (auto& p : ranks)
      for (const auto& init : tracer_->of<rs_comm_init_event>(p.pid())) n += init.op == RS_OP_COMM_SPLIT;
    int calls = 0;
    for (auto& p : ranks) calls += static_cast<int>(tracer_->of<rs_call_event>(p.pid()).size());
    return n == kRanks && calls == kRanks;
  };
  ASSERT_TRUE(tracer_->pump_until(splits_seen, std::chrono::seconds(30))) << logs();

  auto batch = tracer_->batch();
  std::map<uint32_t, int> rank_of_pid;
  for (int r = 0; r < kRanks; ++r) rank_of_pid[static_cast<uint32_t>(ranks[r].pid())] = r;
  uint64_t parent = 0;
  std::map<int, uint64_t> child_of_rank;
  for (auto comm : batch.getComms()) {
    auto it = rank_of_pid.find(comm.getPid());
    if (it == rank_of_pid.end()) continue;
    if (comm.getOrigin() == wire::CommOrigin::INIT_RANK) {
      if (parent == 0) parent = comm.getCommHash();
      EXPECT_EQ(comm.getCommHash(), parent) << "the parent is one communicator";
      EXPECT_EQ(comm.getRank(), it->second);
    } else {
      ASSERT_EQ(comm.getOrigin(), wire::CommOrigin::SPLIT);
      EXPECT_EQ(comm.getParentHash(), parent);
      EXPECT_EQ(comm.getSplitColor(), it->second % 2);
      EXPECT_EQ(comm.getSplitKey(), it->second);
      EXPECT_EQ(comm.getRank(), it->second) << "a child member is named by its parent rank";
      child_of_rank[it->second] = comm.getCommHash();
    }
  }
  ASSERT_EQ(child_of_rank.size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(child_of_rank[0], child_of_rank[2]) << "color 0 on both members";
  EXPECT_EQ(child_of_rank[1], child_of_rank[3]) << "color 1 on both members";
  EXPECT_NE(child_of_rank[0], child_of_rank[1]);
  EXPECT_NE(child_of_rank[0], parent);
  // Each child's collective is recorded under the child, once per member.
  std::map<uint64_t, std::set<int32_t>> members;
  for (const auto& block : blocks_of(batch)) members[block.comm_hash].insert(block.rank);
  EXPECT_EQ(members[child_of_rank[0]], (std::set<int32_t>{0, 2}));
  EXPECT_EQ(members[child_of_rank[1]], (std::set<int32_t>{1, 3}));
  release_children();
  for (auto& p : ranks) EXPECT_EQ(p.wait(std::chrono::seconds(20)), 0) << logs();
}

TEST_F(CaptureTest, InitAllMakesOneCommunicatorWithEveryRankInOneProcess) {
  Process p = child({"initall"});
  ASSERT_TRUE(tracer_->pump_until([&] { return tracer_->of<rs_call_event>(p.pid()).size() >= 2; },
                                  std::chrono::seconds(20)))
      << logs();
  auto inits = tracer_->of<rs_comm_init_event>(p.pid());
  ASSERT_EQ(inits.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(inits[i].op, RS_OP_COMM_INIT_ALL);
    EXPECT_EQ(inits[i].rank, i);
    EXPECT_EQ(inits[i].nranks, 2);
    EXPECT_EQ(inits[i].result, ncclSuccess);
    EXPECT_NE(inits[i].comm, 0u);
  }
  EXPECT_NE(inits[0].comm, inits[1].comm);
  auto batch = tracer_->batch();
  std::set<uint64_t> hashes;
  std::set<int32_t> ranks;
  for (auto comm : batch.getComms()) {
    if (comm.getPid() != static_cast<uint32_t>(p.pid())) continue;
    EXPECT_EQ(comm.getOrigin(), wire::CommOrigin::INIT_ALL);
    EXPECT_EQ(comm.getNranks(), 2);
    hashes.insert(comm.getCommHash());
    ranks.insert(comm.getRank());
  }
  EXPECT_EQ(hashes.size(), 1u) << "both ranks belong to one communicator";
  EXPECT_EQ(ranks, (std::set<int32_t>{0, 1}));
  std::set<int32_t> recorded;
  for (const auto& block : blocks_of(batch)) {
    EXPECT_EQ(hashes.count(block.comm_hash), 1u);
    recorded.insert(block.rank);
  }
  EXPECT_EQ(recorded, (std::set<int32_t>{0, 1}));
  release_children();
  EXPECT_EQ(p.wait(std::chrono::seconds(20)), 0) << logs();
}

TEST_F(CaptureTest, SetenvAfterStartAndCudaSetDeviceNameTheGpu) {
  // The environment it starts with says GPUs 0-3; the program narrows them itself.
  Process p = child({"setenv"}, "ranks", {{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}});
  ASSERT_TRUE(tracer_->pump_until([&] { return !tracer_->of<rs_call_event>(p.pid()).empty(); },
                                  std::chrono::seconds(20)))
      << logs();
  auto setenvs = tracer_->of<rs_setenv_event>(p.pid());
  ASSERT_EQ(setenvs.size(), 1u);
  EXPECT_STREQ(setenvs[0].value, "6,2");
  auto devices = tracer_->of<rs_set_device_event>(p.pid());
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].device, 1);
  EXPECT_EQ(devices[0].result, 0);

  auto batch = tracer_->batch();
  bool found = false;
  for (auto process : batch.getProcesses()) {
    if (process.getPid() != static_cast<uint32_t>(p.pid())) continue;
    found = true;
    EXPECT_EQ(std::string(process.getVisibleDevices().cStr()), "6,2") << "the later value wins over /proc/PID/environ";
    ASSERT_EQ(process.getCudaDevices().size(), 1u);
    EXPECT_EQ(process.getCudaDevices()[0], 1);
  }
  EXPECT_TRUE(found);
  release_children();
  EXPECT_EQ(p.wait(std::chrono::seconds(20)), 0) << logs();
}

TEST_F(CaptureTest, APeersDeathIsReportedThroughGetAsyncError) {
  Process rank1 = child({"peer-death", "1", dir_.file("pd.id"), dir_.path()});
  Process rank0 = child({"peer-death", "0", dir_.file("pd.id"), dir_.path()});
  ASSERT_TRUE(wait_for([&] { return access(dir_.file("issued").c_str(), F_OK) == 0; }, std::chrono::seconds(30)))
      << logs();
  rank1.signal(SIGKILL);
  ASSERT_TRUE(tracer_->pump_until([&] { return !tracer_->of<rs_async_error_event>(rank0.pid()).empty(); },
                                  std::chrono::seconds(30)))
      << logs();
  auto errors = tracer_->of<rs_async_error_event>(rank0.pid());
  EXPECT_EQ(errors[0].result, ncclSuccess);
  EXPECT_EQ(errors[0].async_error, ncclRemoteError);
  // Polls that found nothing were not events: only the error (and maybe a repeat) was.
  EXPECT_LE(errors.size(), 2u);
  auto batch = tracer_->batch();
  uint64_t comm_hash = 0;
  for (auto comm : batch.getComms())
    if (comm.getPid() == static_cast<uint32_t>(rank0.pid())) comm_hash = comm.getCommHash();
  ASSERT_GE(batch.getAsyncErrors().size(), 1u);
  auto sent = batch.getAsyncErrors()[0];
  EXPECT_EQ(sent.getPid(), static_cast<uint32_t>(rank0.pid()));
  EXPECT_EQ(sent.getCommHash(), comm_hash);
  EXPECT_EQ(sent.getAsyncError(), ncclRemoteError);
  release_children();
  EXPECT_EQ(rank0.wait(std::chrono::seconds(20)), 0) << logs();
}

// Run-queue share of the calling thread between two samples.
double runqueue_share(const rs_host_stats& a, const rs_host_stats& b, std::chrono::nanoseconds wall) {
  return static_cast<double>(b.runqueue_ns - a.runqueue_ns) / static_cast<double>(wall.count());
}

TEST_F(CaptureTest, CpuContentionOnItsCoreShowsAsOffCpuAndRunQueueTime) {
  const std::string kStressNg = "/usr/bin/stress-ng";
  ASSERT_EQ(access(kStressNg.c_str(), X_OK), 0) << "stress-ng is installed by scripts/install-deps.sh test";
  // The victim computes on CPU 1 and calls NCCL every 2 ms.
  Process victim = child({"busy", "12"}, "victim", {}, "taskset -c 1");
  std::optional<rs_host_stats> start;
  ASSERT_TRUE(tracer_->pump_until(
      [&] {
        start = tracer_->probes().host_stats(static_cast<uint32_t>(victim.pid()));
        return start && start->threads > 0 && start->on_cpu_ns > 0;
      },
      std::chrono::seconds(20)))
      << logs();
  auto sample = [&] {
    tracer_->probes().poll(0);
    return *tracer_->probes().host_stats(static_cast<uint32_t>(victim.pid()));
  };
  auto window = std::chrono::seconds(3);
  rs_host_stats alone0 = sample();
  observe_for(window);
  rs_host_stats alone1 = sample();

  // A neighbour in another cgroup spins on the same core.
  std::string neighbour = tree_.make(top_ + "/neighbour");
  SpawnOptions hog;
  hog.argv = {"/bin/sh", "-c",
              "echo $$ > '" + neighbour + "/cgroup.procs' && exec " + kStressNg +
                  " --cpu 1 --taskset 1 --timeout 6s --quiet"};
  Process stress(hog);
  observe_for(std::chrono::milliseconds(500));
  rs_host_stats busy0 = sample();
  observe_for(window);
  rs_host_stats busy1 = sample();

  double alone = runqueue_share(alone0, alone1, window);
  double contended = runqueue_share(busy0, busy1, window);
  // Other work on this machine may share CPU 1 too: compare, with a wide margin.
  EXPECT_GT(contended, 0.25) << "alone " << alone;
  EXPECT_GT(contended, alone + 0.15) << "alone " << alone;
  EXPECT_GT(busy1.off_cpu_ns - busy0.off_cpu_ns, alone1.off_cpu_ns - alone0.off_cpu_ns);
  // (Involuntary switches are counted too, but their number depends on the
  // scheduler's slices and on whatever else runs here: not compared.)
  EXPECT_GT(busy1.involuntary_switches, busy0.involuntary_switches);
  EXPECT_GT(busy1.cpu_ns, busy0.cpu_ns);

  // The heartbeat names the neighbour's cgroup among the busy ones, with its path.
  capnp::MallocMessageBuilder message;
  auto heartbeat = message.initRoot<wire::AgentMessage>().initHeartbeat();
  agent::CgroupReport report(agent::cgroup2_mount());
  report.fill(tracer_->probes().cgroup_stats(), heartbeat);
  bool named = false;
  for (auto row : heartbeat.asReader().getCgroups())
    if (std::string(row.getPath().cStr()) == "/" + top_ + "/neighbour") {
      named = true;
      EXPECT_GT(row.getCpuNs(), 1'000'000'000ull) << "it spun for seconds";
    }
  EXPECT_TRUE(named);

  // The summariser's heartbeat carries the counters for the process.
  tracer_->summariser().health(heartbeat, 1, [&](uint32_t pid) { return tracer_->probes().host_stats(pid); });
  bool reported = false;
  for (auto process : heartbeat.asReader().getProcesses())
    if (process.getPid() == static_cast<uint32_t>(victim.pid()) && process.hasHost()) {
      reported = true;
      EXPECT_GE(process.getHost().getRunqueueNs(), busy1.runqueue_ns);
    }
  EXPECT_TRUE(reported);

  // Its final counters come with its exit, and its table entries go.
  release_children();
  ASSERT_EQ(victim.wait(std::chrono::seconds(30)), 0) << logs();
  ASSERT_TRUE(tracer_->pump_until([&] { return !tracer_->of<rs_exit_event>(victim.pid()).empty(); },
                                  std::chrono::seconds(10)));
  auto exit = tracer_->of<rs_exit_event>(victim.pid())[0];
  EXPECT_GE(exit.host.runqueue_ns, busy1.runqueue_ns);
  auto left = tracer_->probes().table_entries(static_cast<uint32_t>(victim.pid()));
  EXPECT_EQ(left.comms + left.p2p + left.waits + left.threads, 0u);
  EXPECT_FALSE(left.processes);
}

// Any user of a node can call NCCL (a stand-in libnccl.so is enough). One
// who makes processes, communicators and point-to-point lanes without end
// holds at most its share of the agent's tables: another user's job is
// still traced in full, and what its processes held is free again once they
// exit.
TEST_F(CaptureTest, AUserOverItsShareOfTheTablesCannotHideAnotherUsersJob) {
  constexpr uint32_t kNobody = 65534;
  tracer_.reset();
  // Shares: 3 processes, 4 communicators, 3 lanes, 64 threads.
  tracer_ = std::make_unique<Tracer>(scope_, multi_uprobes(), agent::Scope::UserShares{3, 4, 3, 64});
  ASSERT_EQ(tracer_->error(), "");
  const std::string open_dir = make_open_dir();
  ASSERT_NE(open_dir, "");
  std::deque<Process> hostile;
  auto start = [&](const std::string& comms, const std::string& mode = "hoard") {
    std::string n = std::to_string(hostile.size());
    hostile.push_back(child({mode, comms}, "hostile",
                            {{"CAPTURE_HOLD", open_dir + "/exit"}, {"CAPTURE_DONE", open_dir + "/done-" + n}},
                            "setpriv --reuid=65534 --regid=65534 --clear-groups", false));
    ASSERT_TRUE(tracer_->pump_until([&] { return access((open_dir + "/done-" + n).c_str(), F_OK) == 0; },
                                    std::chrono::seconds(20)))
        << logs();
    tracer_->probes().poll(50);  // what it made before it said so
  };
  auto calls_of = [&](size_t i) { return tracer_->of<rs_call_event>(hostile[i].pid()).size(); };
  auto use = [&] { return tracer_->probes().user_use(kNobody).value_or(agent::NcclProbes::UserUse{}); };

  start("3");  // three communicators: within its share of four
  start("3");  // one more fits; the other two are not traced
  start("1");  // its third process: within its share of three, but no communicator left
  start("1");  // a fourth process: not traced at all
  EXPECT_EQ(calls_of(0), 3u);
  EXPECT_EQ(calls_of(1), 1u);
  EXPECT_EQ(calls_of(2), 0u);
  EXPECT_EQ(calls_of(3), 0u);
  EXPECT_EQ(use().processes, 3u);
  EXPECT_EQ(use().comms, 4u);
  EXPECT_EQ(use().threads, 3u);
  EXPECT_GE(tracer_->probes().drops().user_share, 4u);
  EXPECT_EQ(tracer_->probes().drops().map_full, 0u);

  // Another user's job is traced in full.
  Process job = child({"group"});
  ASSERT_TRUE(
      tracer_->pump_until([&] { return tracer_->of<rs_call_event>(job.pid()).size() >= 4; }, std::chrono::seconds(20)))
      << logs();
  auto calls = tracer_->of<rs_call_event>(job.pid());
  ASSERT_EQ(calls.size(), 4u);
  for (uint64_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i].seq, i);
  release_children();
  EXPECT_EQ(job.wait(std::chrono::seconds(20)), 0) << logs();

  // The first process exits: its process and communicators are free again.
  hostile[0].signal(SIGKILL);
  EXPECT_EQ(hostile[0].wait(std::chrono::seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE(tracer_->pump_until([&] { return use().processes == 2 && use().comms == 1; }, std::chrono::seconds(10)))
      << use().processes << " processes, " << use().comms << " communicators";
  start("2");
  EXPECT_EQ(calls_of(4), 2u);
  EXPECT_EQ(use().comms, 3u);

  // All gone: the user holds nothing.
  std::FILE* f = std::fopen((open_dir + "/exit").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  for (size_t i = 1; i < hostile.size(); ++i) EXPECT_EQ(hostile[i].wait(std::chrono::seconds(20)), 0) << logs();
  ASSERT_TRUE(tracer_->pump_until([&] { return use().processes == 0; }, std::chrono::seconds(10)));
  EXPECT_EQ(use().comms, 0u);
  EXPECT_EQ(use().lanes, 0u);
  EXPECT_EQ(use().threads, 0u);

  // Point-to-point lanes: a Send and a Recv on each of two communicators
  // want four; the fourth call, past the share of three, is not recorded.
  ASSERT_EQ(std::remove((open_dir + "/exit").c_str()), 0);
  start("2", "pairs");
  auto p2p = tracer_->of<rs_call_event>(hostile.back().pid());
  ASSERT_EQ(p2p.size(), 3u);
  for (const auto& call : p2p) {
    EXPECT_NE(call.lane, 0u);
    EXPECT_EQ(call.seq, 0u) << "each the first of its lane";
  }
  EXPECT_EQ(use().lanes, 3u);
  hostile.back().signal(SIGKILL);
  EXPECT_EQ(hostile.back().wait(std::chrono::seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE(tracer_->pump_until([&] { return use().processes == 0; }, std::chrono::seconds(10)));
  EXPECT_EQ(use().lanes, 0u);
  EXPECT_EQ(use().comms, 0u);
}

// A user given subordinate uids (/etc/subuid, for rootless containers) can
// make a user namespace, map them, and run a process as each: many kernel
// uids. They all count in that user's one share. A namespace root made (a
// container runtime's, for a pod) keeps its processes' own uids.
TEST_F(CaptureTest, ProcessesAsAUsersSubordinateUidsCountInThatUsersShare) {
  constexpr uint32_t kNobody = 65534;
  constexpr uint32_t kSubordinate = 3'000'000, kRuntime = 3'100'000;  // kernel uids of the two namespaces' id 0
  tracer_.reset();
  tracer_ = std::make_unique<Tracer>(scope_, multi_uprobes(), agent::Scope::UserShares{2, 4, 3, 64});
  ASSERT_EQ(tracer_->error(), "");
  const std::string open_dir = make_open_dir();
  ASSERT_NE(open_dir, "");
  std::deque<Process> inside;
  // One process that makes one communicator and calls once, as id `as` of
  // a namespace made by `owner` whose ids start at kernel uid `base`.
  auto start = [&](uint32_t owner, uint32_t base, uint32_t as) {
    std::string n = std::to_string(inside.size());
    std::string prefix = "'" + bin_path("rankscope-userns-run") + "' --owner " + std::to_string(owner) + " --base " +
                         std::to_string(base) + " --count 16 --as " + std::to_string(as) + " --";
    inside.push_back(child({"hoard", "1"}, "inside",
                           {{"CAPTURE_HOLD", open_dir + "/exit"}, {"CAPTURE_DONE", open_dir + "/done-" + n}}, prefix,
                           false));
    ASSERT_TRUE(tracer_->pump_until([&] { return access((open_dir + "/done-" + n).c_str(), F_OK) == 0; },
                                    std::chrono::seconds(20)))
        << logs();
    tracer_->probes().poll(50);
  };
  auto calls_of = [&](size_t i) { return tracer_->of<rs_call_event>(inside[i].pid()).size(); };
  auto use = [&](uint32_t uid) { return tracer_->probes().user_use(uid); };

  // Three processes as three subordinate uids of nobody's namespace: its share is two.
  start(kNobody, kSubordinate, 1);
  start(kNobody, kSubordinate, 2);
  start(kNobody, kSubordinate, 3);
  EXPECT_EQ(calls_of(0), 1u);
  EXPECT_EQ(calls_of(1), 1u);
  EXPECT_EQ(calls_of(2), 0u) << "a third kernel uid is not a third share";
  ASSERT_TRUE(use(kNobody).has_value());
  EXPECT_EQ(use(kNobody)->processes, 2u);
  EXPECT_EQ(use(kNobody)->comms, 2u);
  for (uint32_t as : {1u, 2u, 3u}) EXPECT_FALSE(use(kSubordinate + as).has_value()) << as;
  EXPECT_GE(tracer_->probes().drops().user_share, 1u);
  // The agent names the same user for them (the usage ledger's), and their own uid.
  auto user_of = [](uid_t uid) {
    passwd* entry = getpwuid(uid);
    return entry ? std::string(entry->pw_name) : "uid " + std::to_string(uid);
  };
  auto identity = agent::read_identity("/proc", static_cast<uint32_t>(inside[1].pid()));
  ASSERT_TRUE(identity.has_value());
  EXPECT_EQ(identity->uid, kSubordinate + 2);
  EXPECT_EQ(identity->user, user_of(kNobody));

  // Root's namespace: each process counts as its own kernel uid.
  start(0, kRuntime, 1);
  start(0, kRuntime, 2);
  EXPECT_EQ(calls_of(3), 1u);
  EXPECT_EQ(calls_of(4), 1u);
  for (uint32_t as : {1u, 2u}) {
    ASSERT_TRUE(use(kRuntime + as).has_value()) << as;
    EXPECT_EQ(use(kRuntime + as)->processes, 1u) << as;
  }
  EXPECT_FALSE(use(0).has_value());
  identity = agent::read_identity("/proc", static_cast<uint32_t>(inside[3].pid()));
  ASSERT_TRUE(identity.has_value());
  EXPECT_EQ(identity->user, user_of(kRuntime + 1));

  // Their exits give the shares back to whom they were counted in.
  std::FILE* f = std::fopen((open_dir + "/exit").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  for (auto& p : inside) EXPECT_EQ(p.wait(std::chrono::seconds(20)), 0) << logs();
  ASSERT_TRUE(tracer_->pump_until([&] { return use(kNobody)->processes == 0; }, std::chrono::seconds(10)));
  EXPECT_EQ(use(kNobody)->comms, 0u);
  EXPECT_EQ(use(kRuntime + 1)->processes, 0u);
}

// The agent's own memory with 1,000 traced processes and 100,000
// communicators made and destroyed over time: everything of an exited
// process or a destroyed communicator is freed, in the BPF tables and in
// the agent's summariser, and its heap returns to where it was.
TEST_F(CaptureTest, AgentMemoryStaysBoundedOverAThousandProcessesAndAHundredThousandCommunicators) {
  constexpr int kProcesses = 1000;
  constexpr int kCommsEach = 100;
  constexpr int kConcurrent = 8;
  tracer_->keep_events(false);  // the test's own copy of the events is not the agent's memory
  auto& summariser = tracer_->summariser();
  size_t records = 0;
  // What the agent's loop does between batches and heartbeats.
  auto agent_tick = [&] {
    tracer_->probes().poll(5);
    records += summariser.pending_records();
    tracer_->batch();
    summariser.forget_exited();
    summariser.take_ring_candidates();
    capnp::MallocMessageBuilder message;
    summariser.health(message.initRoot<wire::AgentMessage>().initHeartbeat(), 0,
                      [&](uint32_t pid) { return tracer_->probes().host_stats(pid); });
    summariser.exits_reported();  // a collector took it
  };
  std::deque<Process> running;
  size_t baseline_heap = 0, peak_processes = 0, peak_comms = 0;
  for (int started = 0; started < kProcesses || !running.empty();) {
    while (started < kProcesses && running.size() < kConcurrent) {
      running.push_back(child({"churn", std::to_string(kCommsEach)}, "churn", {}, "", false));
      ++started;
    }
    agent_tick();
    peak_processes = std::max(peak_processes, summariser.traced_processes());
    peak_comms = std::max(peak_comms, summariser.known_comms());
    while (!running.empty() && !running.front().running()) {
      ASSERT_EQ(running.front().wait(std::chrono::seconds(5)), 0) << logs();
      running.pop_front();
    }
    // Several may start in one pass: the first pass at or past 100 sets it.
    if (started >= 100 && baseline_heap == 0) baseline_heap = mallinfo2().uordblks;
  }
  // The last exits and records drain; forget_exited sends each exit once more, then frees it.
  for (int i = 0; i < 40; ++i) {
    agent_tick();
    observe_for(std::chrono::milliseconds(20));
  }
  size_t heap = mallinfo2().uordblks;

  ASSERT_GT(baseline_heap, 0u);
  EXPECT_EQ(records, static_cast<size_t>(kProcesses) * kCommsEach) << "every AllReduce was seen once";
  EXPECT_EQ(summariser.traced_processes(), 0u);
  EXPECT_EQ(summariser.known_comms(), 0u);
  EXPECT_GT(peak_processes, 0u);
  EXPECT_LE(peak_comms, static_cast<size_t>(kConcurrent) * 2 + 2) << "destroyed communicators are freed as they go";
  auto tables = tracer_->probes().table_sizes();
  EXPECT_EQ(tables.processes, 0u);
  EXPECT_EQ(tables.threads, 0u);
  EXPECT_EQ(tables.comms, 0u);
  EXPECT_EQ(tables.p2p, 0u);
  EXPECT_EQ(tables.waits, 0u);
  EXPECT_EQ(tables.comm_slots, 0u) << "every communicator's counter slot was given back";
  // Slots are reused: far fewer were ever made than communicators created.
  EXPECT_LE(tables.comm_slots_made, static_cast<size_t>(kConcurrent) * 4 + 4);
  auto drops = tracer_->probes().drops();
  EXPECT_EQ(drops.ringbuf_full + drops.map_full, 0u);
  // 900 processes and 90,000 communicators after the baseline: the heap may
  // wobble (allocator caches), not grow with them.
  EXPECT_LT(heap, baseline_heap + (1u << 20)) << "baseline " << baseline_heap << " bytes, now " << heap;
}

}  // namespace
}  // namespace rankscope::testing
