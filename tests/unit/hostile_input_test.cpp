// What a hostile or broken peer can send the collector's ingest, on a real
// RocksDB: messages past the bounds of collector/ingest/validate.h are refused and
// counted for their peer; entries out of range are skipped and counted; the
// rest of the message still counts. Each case reproduces an input the fuzz
// target (tests/fuzz/agent_message_fuzz.cpp) found or would find.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>

#include "collector/service.h"
#include "node-agent/summarise.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"

namespace rankscope::collector {
namespace {

using FixedClock = testing::ManualClock;

std::string hello(const std::string& node) {
  return testing::hello_message(node, 99, 1'000 + 5'000'000, 1'000);
}

// A valid batch of `records` collectives of rank 1 (of 2); `edit` changes it before it is packed.
std::string batch(uint64_t seq, size_t records, const std::function<void(wire::Batch::Builder)>& edit = {}) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(99);
  b.setSeq(seq);
  auto comms = b.initComms(1);
  comms[0].setPid(10);
  comms[0].setCommHash(0xc0ffee);
  comms[0].setRank(1);
  comms[0].setNranks(2);
  proto::ColumnBlock block;
  block.pid = 10;
  block.comm_hash = 0xc0ffee;
  block.rank = 1;
  for (size_t i = 0; i < records; ++i) {
    proto::CallRecord r;
    r.seq = i;
    r.issue_ns = 2'000 + i * 100;
    r.return_ns = r.issue_ns + 10;
    r.count = 256;
    r.op = RS_OP_ALLREDUCE;
    block.records.push_back(r);
  }
  proto::encode_collectives({&block}, b);
  if (edit) edit(b);
  return proto::to_packed(message);
}

bool is_error(const std::string& bytes) {
  bool error = false;
  EXPECT_TRUE(proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto m) {
    error = m.which() == wire::CollectorMessage::ERROR;
  }));
  return error;
}

// What a process's stand-in libnccl.so makes the agent's probes report.
rs_comm_init_event comm_init(uint32_t pid, uint64_t comm, uint64_t ts) {
  rs_comm_init_event init{};
  init.hdr.pid = init.hdr.tid = pid;
  init.hdr.kind = RS_EV_COMM_INIT;
  init.hdr.ts_ns = ts;
  init.entry_ns = ts - 10;
  init.comm = comm;
  init.nranks = 2;
  init.rank = 0;
  init.op = RS_OP_COMM_INIT_RANK;
  std::memcpy(init.unique_id, &comm, sizeof(comm));  // a unique id of its own
  std::memcpy(init.unique_id + sizeof(comm), &pid, sizeof(pid));
  return init;
}

rs_call_event all_reduce(uint32_t pid, uint64_t comm, uint64_t seq, uint64_t ts, uint64_t count) {
  rs_call_event call{};
  call.hdr.pid = call.hdr.tid = pid;
  call.hdr.kind = RS_EV_CALL;
  call.hdr.ts_ns = ts;
  call.entry_ns = ts - 5;
  call.comm = comm;
  call.seq = seq;
  call.count = count;
  call.peer = -1;
  call.op = RS_OP_ALLREDUCE;
  call.datatype = 7;
  return call;
}

class HostileInputTest : public ::testing::Test {
 protected:
  HostileInputTest() {
    Outbox out;
    ingest.on_agent_message("conn-1", hello("gpu-1"), out);
  }
  uint64_t node_bad() const { return ingest.node("gpu-1")->bad_messages; }
  // Sends what `summariser` holds, a batch at a time, as the agent would:
  // each must fit the collector's frame, be taken and acknowledged. Returns
  // the batches' sizes (packed).
  std::vector<size_t> drain(agent::Summariser& summariser, int at_most,
                            const std::function<void(wire::Batch::Reader)>& inspect = {}) {
    std::vector<size_t> sizes;
    while (!summariser.empty()) {
      if (static_cast<int>(sizes.size()) == at_most) {
        ADD_FAILURE() << "the summariser does not drain in " << at_most << " batches";
        break;
      }
      capnp::MallocMessageBuilder message;
      auto b = message.initRoot<wire::AgentMessage>().initBatch();
      b.setInstanceId(99);
      b.setSeq(sizes.size() + 1);
      summariser.fill(b, DropCounts{});
      if (inspect) inspect(b.asReader());
      const std::string bytes = proto::to_packed(message);
      sizes.push_back(bytes.size());
      EXPECT_LE(bytes.size(), proto::kMaxAgentMessageBytes) << "batch " << sizes.size() << " would be dropped unread";
      Outbox out;
      ingest.on_agent_message("conn-1", bytes, out);
      EXPECT_TRUE(out.now.empty() || !is_error(out.now[0].second)) << "batch " << sizes.size() << " refused";
      EXPECT_EQ(out.after_commit.size(), 1u) << "batch " << sizes.size() << " not acknowledged";
      EXPECT_TRUE(commit.run(0));
    }
    return sizes;
  }

  testing::TempDir dir;
  std::unique_ptr<TimelineStore> store = std::move(TimelineStore::open(dir.file("db")).value());
  FixedClock clock;
  Service service{*store, clock, ServiceOptions{}};
  Commit& commit = service.commit();
  Ingest& ingest = service.ingest();
};

// One process of a user's stand-in libnccl.so opens 70,000 communicators
// (one call each) within one batch interval. A batch carrying them all
// would be refused whole, and re-sent for ever: the node would go dark. The
// agent's real summariser spreads them over batches the collector takes.
// A batch carries at most kMaxListEntries communicators: the agent sends the
// rest in the next one (never an end before its announcement), and the
// collector takes them all, within what one node may make it keep
// (kMaxMembershipsPerNode live memberships): the rest is refused and counted.
TEST_F(HostileInputTest, AProcessWithMoreCommunicatorsThanABatchMayCarryIsSentOverSeveralBatches) {
  testing::TempDir proc;  // an empty /proc: the process's identity is its pid only
  agent::Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t pid = 4242;
  const uint64_t kComms = kMaxListEntries + 4464;  // 70,000
  for (uint64_t h = 1; h <= kComms; ++h) {
    summariser.on_event(comm_init(pid, h, 1'000'000 + h));
    summariser.on_event(all_reduce(pid, h, 0, 2'000'000 + h * 10, 1024));
  }
  rs_comm_end_event end{};
  end.hdr.pid = end.hdr.tid = pid;
  end.hdr.kind = RS_EV_COMM_END;
  end.comm = 1;
  end.op = RS_OP_COMM_DESTROY;
  summariser.on_event(end);
  // The last communicator broke; it is announced in the second batch. The
  // agent tells a broken communicator once: never before its announcement.
  rs_async_error_event broke{};
  broke.hdr.pid = broke.hdr.tid = pid;
  broke.hdr.kind = RS_EV_ASYNC_ERROR;
  broke.comm = kComms;
  broke.async_error = 3;
  summariser.on_event(broke);

  std::set<uint64_t> announced;
  int errors = 0;
  EXPECT_EQ(drain(summariser, 10,
                  [&](wire::Batch::Reader b) {
                    for (auto c : b.getComms()) announced.insert(c.getHandle());
                    for (auto e : b.getAsyncErrors()) {
                      ++errors;
                      EXPECT_EQ(announced.count(kComms), 1u) << "an error before its communicator's announcement";
                      (void)e;
                    }
                  })
                .size(),
            2u);
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(node_bad(), 0u);
  EXPECT_EQ(ingest.comms().size(), kMaxMembershipsPerNode);
  EXPECT_EQ(ingest.counters().records_stored, kMaxMembershipsPerNode);
  EXPECT_EQ(ingest.node("gpu-1")->memberships, kMaxMembershipsPerNode);
  // Each communicator past the cap: its announcement and its collectives.
  EXPECT_EQ(ingest.node("gpu-1")->refused_claims, 2 * (kComms - kMaxMembershipsPerNode));
  EXPECT_TRUE(std::any_of(ingest.comms().begin(), ingest.comms().end(), [](const auto& c) { return c.second.ended; }))
      << "the end reached the collector before its communicator";
}

// A user's process splits its communicator without a color in a loop: the
// agent keeps 65,536 such splits to announce again to a job's new
// collector, and past that drops the oldest of the communicator holding
// the most: the user's own, not another job's.
TEST_F(HostileInputTest, SplitsWithoutAColorInALoopDropTheirOwnNotAnotherJobs) {
  testing::TempDir proc;
  agent::Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t victim = 5000, user = 5001;
  auto no_color = [](uint32_t pid, uint64_t parent, uint64_t ts) {
    rs_comm_init_event e = comm_init(pid, 0, ts);
    e.op = RS_OP_COMM_SPLIT;
    e.parent_comm = parent;
    e.color = -1;
    e.nranks = -1;
    return e;
  };
  summariser.on_event(comm_init(victim, 1, 1'000));
  summariser.on_event(no_color(victim, 1, 2'000));
  summariser.on_event(comm_init(user, 2, 1'000));
  for (uint64_t i = 0; i < proto::kMaxListEntries + 5'000; ++i) summariser.on_event(no_color(user, 2, 3'000 + i));
  drain(summariser, 10);
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  summariser.announce(b, DropCounts{}, "");
  size_t victims = 0, users = 0;
  for (auto c : b.getComms())
    if (c.getHandle() == 0) (c.getPid() == victim ? victims : users) += 1;
  EXPECT_EQ(victims, 1u) << "another job's split without a color was dropped";
  // 65,535 of the user's kept; the list holds 65,536 with both parents and
  // the victim's: the user's newest two go as new ones, in the next batch.
  EXPECT_EQ(users, proto::kMaxListEntries - 3u);
}

// A stand-in libnccl.so calls ncclAllReduce as fast as the probes let it,
// with values that pack badly (random counts, gaps, durations, types,
// peers and results): a million records within one batch interval. As one batch they would be past the
// frame the collector reads: libzmq drops such a frame unread, and the agent
// would send it for ever, holding up its node's other records. The agent
// spreads them over batches that fit, and every record is stored.
TEST_F(HostileInputTest, AStormOfCallsIsSentInBatchesThatFitTheCollectorsFrame) {
  testing::TempDir proc;
  agent::Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t pid = 4243;
  summariser.on_event(comm_init(pid, 1, 1'000'000));
  std::mt19937_64 random(7);
  const uint64_t kCalls = 1'000'000;
  uint64_t ts = 2'000'000'000, seq = 0;
  for (uint64_t i = 0; i < kCalls; ++i) {
    ts += 1'000'000'000 + random() % (1ull << 32);
    seq += 1 + random() % 1000;
    rs_call_event call = all_reduce(pid, 1, seq, ts, random());
    call.entry_ns = ts - random() % 1'000'000'000;
    call.peer = static_cast<int32_t>(random());
    call.result = static_cast<int32_t>(random() % 256);
    call.datatype = static_cast<uint8_t>(random());
    call.redop = static_cast<uint8_t>(random());
    summariser.on_event(call);
  }
  const std::vector<size_t> sizes = drain(summariser, 10);
  EXPECT_GT(std::accumulate(sizes.begin(), sizes.end(), size_t{0}), proto::kMaxAgentMessageBytes)
      << "the storm fits one frame: it tests nothing";
  EXPECT_EQ(ingest.counters().records_stored, kCalls);
  EXPECT_EQ(node_bad(), 0u);
}

// Users write their own environment: up to 128 KiB a variable. A process's
// identity strings from it are bounded (proto::kMaxIdentityText): a value
// past the bound is not sent (never cut: a cut job id could name another
// job). 3,500 processes whose strings are all at the bound are more than
// one frame: they go over several batches, each of which fits (identities
// take at most kAgentIdentityBytesPerBatch of one).
TEST_F(HostileInputTest, LongIdentitiesGoOverBatchesThatFitAndOnesPastTheBoundAreNotSent) {
  testing::TempDir proc;
  auto write = [&](const std::string& name, const std::string& content) {
    std::filesystem::create_directories(std::filesystem::path(proc.file(name)).parent_path());
    std::ofstream(proc.file(name), std::ios::binary) << content;
  };
  auto text = [](char c) { return std::string(proto::kMaxIdentityText, c); };
  const uint32_t kFirst = 1000, kProcesses = 3500;
  for (uint32_t pid = kFirst; pid <= kFirst + kProcesses; ++pid) {
    const std::string dir = std::to_string(pid);
    write(dir + "/stat", dir + " (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 " + dir + " 1 2 3\n");
    write(dir + "/status", "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n");
    // The first process's job id and step are past the bound.
    std::string job = pid == kFirst ? std::string(128 << 10, '7') : dir + text('j').substr(dir.size());
    std::string step = pid == kFirst ? text('s') + "s" : text('s');
    std::string environ;
    for (const std::string& entry : {"RANKSCOPE_JOB_ID=" + job, "CUDA_VISIBLE_DEVICES=" + text('d'),
                                     "POD_NAME=" + text('p'), "POD_NAMESPACE=" + text('n'), "SLURM_STEP_ID=" + step})
      environ += entry + '\0';
    write(dir + "/environ", environ);
  }
  agent::Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  for (uint32_t pid = kFirst; pid <= kFirst + kProcesses; ++pid) summariser.on_event(comm_init(pid, 1, 1'000'000));
  const std::vector<size_t> sizes = drain(summariser, 40);
  EXPECT_GT(std::accumulate(sizes.begin(), sizes.end(), size_t{0}), proto::kMaxAgentMessageBytes)
      << "the identities fit one frame: this tests nothing";
  EXPECT_EQ(node_bad(), 0u);
  const auto& processes = ingest.model().processes;
  ASSERT_EQ(processes.size(), kProcesses + 1);
  for (const auto& [key, info] : processes) {
    EXPECT_EQ(info.pod_name, text('p'));
    if (key.pid != kFirst) {
      EXPECT_EQ(info.job.size(), proto::kMaxIdentityText);
      EXPECT_EQ(info.slurm_step, text('s'));
      continue;
    }
    EXPECT_EQ(info.slurm_step, "") << "a step past the bound was sent";
    EXPECT_EQ(info.job.rfind("nccl-", 0), 0u) << "not a job the collector named: " << info.job.substr(0, 40);
  }
}

// A user starts 20,000 processes that each touch NCCL. A heartbeat lists at
// most 16,384 (well within the collector's frame and list bounds), each
// process in turn: two heartbeats cover them all.
TEST_F(HostileInputTest, AHeartbeatListsEveryProcessInTurnWhenTheyDoNotAllFit) {
  testing::TempDir proc;
  agent::Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t kProcesses = 20'000;
  for (uint32_t pid = 1; pid <= kProcesses; ++pid) summariser.on_event(comm_init(pid, 1, 1'000'000));
  std::set<uint32_t> listed;
  for (int beat = 0; beat < 2; ++beat) {
    capnp::MallocMessageBuilder message;
    auto heartbeat = message.initRoot<wire::AgentMessage>().initHeartbeat();
    summariser.health(heartbeat, 2'000'000);
    EXPECT_EQ(heartbeat.getProcesses().size(), 16'384u);
    for (auto p : heartbeat.getProcesses()) listed.insert(p.getPid());
    Outbox out;
    ingest.on_agent_message("conn-1", proto::to_packed(message), out);
  }
  EXPECT_EQ(listed.size(), kProcesses);
  EXPECT_EQ(node_bad(), 0u);
}

// What the collector does with an agent that sends them all the same (an
// older one, or one not ours): a process past a bound is skipped with the
// reason, the batch's others are kept.
TEST_F(HostileInputTest, AProcessWithAStringPastItsBoundIsSkipped) {
  Outbox out;
  ingest.on_agent_message("conn-1",
                          batch(1, 1,
                                [](auto b) {
                                  auto processes = b.initProcesses(3);
                                  processes[0].setPid(10);
                                  processes[0].setJob("77");
                                  processes[1].setPid(11);
                                  processes[1].setJob(std::string(proto::kMaxIdentityText + 1, '7'));
                                  processes[2].setPid(12);
                                  processes[2].setCgroupPath(std::string(proto::kMaxIdentityPath + 1, '/'));
                                }),
                          out);
  EXPECT_EQ(out.after_commit.size(), 1u);
  EXPECT_EQ(node_bad(), 2u);
  const auto& processes = ingest.model().processes;
  ASSERT_EQ(processes.size(), 1u);
  EXPECT_EQ(processes.begin()->second.job, "77");
  EXPECT_EQ(ingest.counters().records_stored, 1u);
}

// A watchdog asks ncclCommGetAsyncError again and again; a stand-in
// libnccl.so answers "broken" a hundred thousand times. The agent reports a
// broken communicator once. A stand-in libcudart says yes to every
// cudaSetDevice: the process's first kMaxCudaDevices devices are kept.
TEST_F(HostileInputTest, ABrokenCommunicatorIsReportedOnceAndDevicesAreBounded) {
  testing::TempDir proc;
  agent::Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t pid = 4244;
  summariser.on_event(comm_init(pid, 1, 1'000'000));
  for (int i = 0; i < 100'000; ++i) {
    rs_set_device_event e{};
    e.hdr.pid = e.hdr.tid = pid;
    e.hdr.kind = RS_EV_SET_DEVICE;
    e.device = i;
    summariser.on_event(e);
  }
  for (int i = 0; i < 100'000; ++i) {
    rs_async_error_event e{};
    e.hdr.pid = e.hdr.tid = pid;
    e.hdr.kind = RS_EV_ASYNC_ERROR;
    e.hdr.ts_ns = 2'000'000 + i;
    e.comm = 1;
    e.async_error = 3;  // ncclInternalError
    summariser.on_event(e);
  }
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  summariser.fill(b, DropCounts{});
  ASSERT_EQ(b.getAsyncErrors().size(), 1u);
  EXPECT_EQ(b.getAsyncErrors()[0].getAsyncError(), 3);
  ASSERT_EQ(b.getProcesses().size(), 1u);
  EXPECT_EQ(b.getProcesses()[0].getCudaDevices().size(), proto::kMaxCudaDevices);
}

// Found by fuzz_agent_message (a timeout): a few hundred packed bytes named
// millions of empty clock samples, each refitting the node's clock; the
// collector loop stalled on one message.
TEST_F(HostileInputTest, FloodOfClockSamplesIsRefusedWhole) {
  std::string bytes = batch(1, 3, [](auto b) { b.initClockSamples(1'000'000); });
  EXPECT_LT(bytes.size(), 100'000u);  // small on the wire: packing makes the empty samples nearly free
  Outbox out;
  ingest.on_agent_message("conn-1", bytes, out);
  ASSERT_EQ(out.now.size(), 1u);
  EXPECT_TRUE(is_error(out.now[0].second));
  EXPECT_TRUE(out.after_commit.empty());  // not acknowledged: nothing of it is stored
  EXPECT_EQ(ingest.counters().records_stored, 0u);
  EXPECT_EQ(node_bad(), 1u);
  EXPECT_EQ(ingest.counters().bad_messages, 1u);

  Outbox fine;  // the connection goes on
  ingest.on_agent_message("conn-1", batch(2, 3), fine);
  EXPECT_EQ(fine.after_commit.size(), 1u);
  EXPECT_EQ(ingest.counters().records_stored, 3u);
}

// The same amplification through record counts: empty columns mean "all
// zero", so a block of a few bytes may claim a million records, and a batch
// many such blocks.
TEST_F(HostileInputTest, RecordsPastTheBatchLimitAreRefused) {
  std::string bytes = batch(1, 0, [](auto b) {
    auto blocks = b.initCollectives(3);
    for (auto block : blocks) block.setCount(kMaxRecordsPerBatch / 2);
    b.initCommTable(1).set(0, 0xc0ffee);
  });
  Outbox out;
  ingest.on_agent_message("conn-1", bytes, out);
  ASSERT_EQ(out.now.size(), 1u);
  EXPECT_TRUE(is_error(out.now[0].second));
  EXPECT_EQ(ingest.counters().records_stored, 0u);
  EXPECT_EQ(node_bad(), 1u);
}

// A communicator of 2^31-1 ranks made the detector allocate per-rank state
// for all of them on the first record (out of memory).
TEST_F(HostileInputTest, CommunicatorSizesOutOfRangeAreSkipped) {
  uint64_t seq = 0;
  for (auto [rank, nranks] : {std::pair{0, 0x7fffffff}, {0, 0}, {-3, 4}, {4, 4}, {0, kMaxRanks + 1}}) {
    Outbox out;
    ingest.on_agent_message("conn-1", batch(++seq, 2, [&](auto b) {
      b.getComms()[0].setRank(rank);
      b.getComms()[0].setNranks(nranks);
      b.getComms()[0].setCommHash(0xbad);
    }), out);
    EXPECT_EQ(out.after_commit.size(), 1u) << rank << " of " << nranks;  // the rest of the batch is taken
  }
  EXPECT_EQ(ingest.comms().count(0xbad), 0u);
  EXPECT_EQ(node_bad(), 5u);
  EXPECT_EQ(ingest.comms().at(0xc0ffee).nranks, -1);  // only the blocks named it; its size is still unknown

  // A split child's member, whose size no member knows (-1), is taken, not
  // counted as bad; -1 from any other origin, or a rank out of range, is.
  for (auto [origin, rank, bad] : {std::tuple{wire::CommOrigin::SPLIT, 3, false},
                                   {wire::CommOrigin::INIT_RANK, 3, true},
                                   {wire::CommOrigin::SPLIT, -1, true},
                                   {wire::CommOrigin::SPLIT, kMaxRanks, true}}) {
    uint64_t before = node_bad();
    Outbox out;
    ingest.on_agent_message("conn-1", batch(++seq, 2, [&](auto b) {
      b.getComms()[0].setRank(rank);
      b.getComms()[0].setNranks(-1);
      b.getComms()[0].setOrigin(origin);
      b.getComms()[0].setCommHash(bad ? 0xbad : 0x5b1170);
    }), out);
    EXPECT_EQ(node_bad() - before, bad ? 1u : 0u) << static_cast<int>(origin) << " rank " << rank;
  }
  ASSERT_EQ(ingest.comms().count(0x5b1170), 1u);
  EXPECT_EQ(ingest.comms().at(0x5b1170).origin, CommOrigin::split);
  EXPECT_EQ(ingest.comms().count(0xbad), 0u);
}

TEST_F(HostileInputTest, RanksOutOfRangeInBlocksAndProcessesAreSkipped) {
  Outbox out;
  ingest.on_agent_message("conn-1", batch(1, 4, [](auto b) {
    b.getCollectives()[0].setRank(-7);
    auto procs = b.initProcesses(2);
    procs[0].setPid(10);
    procs[0].setRank(kMaxRanks);
    procs[1].setPid(11);
    procs[1].setRank(3);
    procs[1].setWorldSize(8);
  }), out);
  EXPECT_EQ(out.after_commit.size(), 1u);
  EXPECT_EQ(ingest.counters().records_stored, 0u);
  EXPECT_EQ(ingest.process("gpu-1", 10), nullptr);
  ASSERT_NE(ingest.process("gpu-1", 11), nullptr);
  EXPECT_EQ(ingest.process("gpu-1", 11)->rank, 3);
  EXPECT_EQ(node_bad(), 2u);
}

TEST_F(HostileInputTest, HeartbeatFloodIsRefused) {
  capnp::MallocMessageBuilder message;
  auto h = message.initRoot<wire::AgentMessage>().initHeartbeat();
  h.initProcesses(kMaxListEntries + 1);
  Outbox out;
  ingest.on_agent_message("conn-1", proto::to_packed(message), out);
  EXPECT_TRUE(ingest.node("gpu-1")->health.empty());
  EXPECT_EQ(node_bad(), 1u);
}

TEST_F(HostileInputTest, NodeNamesMustBePrintable) {
  for (std::string name : {std::string("gpu 1"), std::string("gpu\n1"), std::string("gpu\x7f"), std::string(256, 'x')}) {
    Outbox out;
    ingest.on_agent_message("conn-x", hello(name), out);
    bool accepted = true;
    ASSERT_EQ(out.now.size(), 1u);
    ASSERT_TRUE(proto::read_packed<wire::CollectorMessage>(out.now[0].second, proto::ReadLimits{}, [&](auto m) {
      accepted = m.getHelloReply().getAccepted();
    }));
    EXPECT_FALSE(accepted);
    EXPECT_EQ(ingest.node(name), nullptr);
  }
  EXPECT_EQ(ingest.counters().bad_messages, 4u);  // counted, but for no node: none was identified
}

TEST(BadMessageLog, CountsWhatItDoesNotLog) {
  BadMessageLog log;
  EXPECT_TRUE(log.report("node a", "one", 1'000));
  EXPECT_FALSE(log.report("node a", "two", 2'000));   // within the interval: counted, not logged
  EXPECT_TRUE(log.report("node b", "one", 2'000));    // per peer
  EXPECT_FALSE(log.report("node a", "three", 1'000 + BadMessageLog::kIntervalNs - 1));
  EXPECT_TRUE(log.report("node a", "four", 1'000 + BadMessageLog::kIntervalNs));  // says 2 more were not logged
}

}  // namespace
}  // namespace rankscope::collector
