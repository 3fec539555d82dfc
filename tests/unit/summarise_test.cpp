// The agent's summariser on hand-made BPF events: how it names
// communicators, so that every member of one names it alike.
#include "node-agent/summarise.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "proto/records.h"
#include "tests/support/harness.h"
#include "tests/support/manual_clock.h"

namespace rankscope::agent {
namespace {

namespace wire = proto::wire;

rs_comm_init_event init_event(uint32_t pid, uint8_t op, uint64_t comm, uint64_t parent, int32_t color, uint64_t ts) {
  rs_comm_init_event e{};
  e.hdr.pid = e.hdr.tid = pid;
  e.hdr.kind = RS_EV_COMM_INIT;
  e.hdr.ts_ns = ts;
  e.entry_ns = ts - 10;
  e.comm = comm;
  e.parent_comm = parent;
  e.op = op;
  e.color = color;
  e.nranks = op == RS_OP_COMM_SPLIT ? -1 : 2;
  e.rank = static_cast<int32_t>(pid % 2);
  std::memcpy(e.unique_id, "the-job-unique-id", 17);  // the parent: one unique id for both ranks
  return e;
}

// (pid, local handle) -> hash, as a batch announces them.
std::map<std::pair<uint32_t, uint64_t>, uint64_t> announced(Summariser& summariser) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  summariser.fill(b, DropCounts{});
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> out;
  for (auto c : b.getComms()) out[{c.getPid(), c.getHandle()}] = c.getCommHash();
  return out;
}

// NCCL_SPLIT_NOCOLOR: the rank takes part in ncclCommSplit and gets no
// child (a null communicator, ncclSuccess). It still counts among the
// parent's splits, or its next child would be named apart from the others'.
TEST(Summarise, ASplitWithoutAChildStillCountsAmongItsParentsSplits) {
  testing::TempDir proc;  // an empty /proc
  Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t a = 100, b = 101;
  for (uint32_t pid : {a, b}) summariser.on_event(init_event(pid, RS_OP_COMM_INIT_RANK, 0x10, 0, 0, 1'000));
  // First split: rank a has no color, rank b joins child color 3.
  summariser.on_event(init_event(a, RS_OP_COMM_SPLIT, 0, 0x10, -1, 2'000));
  summariser.on_event(init_event(b, RS_OP_COMM_SPLIT, 0x21, 0x10, 3, 2'000));
  // Second split: both join color 5: one child, one name.
  summariser.on_event(init_event(a, RS_OP_COMM_SPLIT, 0x31, 0x10, 5, 3'000));
  summariser.on_event(init_event(b, RS_OP_COMM_SPLIT, 0x32, 0x10, 5, 3'000));
  auto hashes = announced(summariser);
  ASSERT_EQ(hashes.count({a, 0x10}), 1u);
  EXPECT_EQ(hashes.at({a, 0x10}), hashes.at({b, 0x10}));
  ASSERT_EQ(hashes.count({a, 0x31}), 1u);
  ASSERT_EQ(hashes.count({b, 0x32}), 1u);
  EXPECT_EQ(hashes.at({a, 0x31}), hashes.at({b, 0x32})) << "the two members of the second split's child disagree";
  EXPECT_NE(hashes.at({b, 0x21}), hashes.at({b, 0x32}));
  // NCCL's own names (its commHash) for the children: (parent, split count, color).
  const uint64_t parent = hashes.at({a, 0x10});
  EXPECT_EQ(hashes.at({b, 0x21}), proto::comm_hash_of_split(parent, 1, 3));
  EXPECT_EQ(hashes.at({a, 0x31}), proto::comm_hash_of_split(parent, 2, 5));
}

// What each member said of each split reaches the collector, which sizes
// the children from it: the split's index, color and key, the member's
// parent rank, and a member that got no child (announced with no handle).
TEST(Summarise, EveryMemberOfASplitIsAnnouncedWithTheSplitsIndexColorAndKey) {
  testing::TempDir proc;
  Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t a = 100, b = 101;
  for (uint32_t pid : {a, b}) summariser.on_event(init_event(pid, RS_OP_COMM_INIT_RANK, 0x10, 0, 0, 1'000));
  auto none = init_event(a, RS_OP_COMM_SPLIT, 0, 0x10, -1, 2'000);
  none.key = 4;
  summariser.on_event(none);
  auto child = init_event(b, RS_OP_COMM_SPLIT, 0x21, 0x10, 3, 2'000);
  child.key = 7;
  summariser.on_event(child);
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::AgentMessage>().initBatch();
  summariser.fill(batch, DropCounts{});
  uint64_t parent = 0;
  std::map<uint32_t, wire::Comm::Reader> splits;
  for (auto c : batch.getComms()) {
    if (c.getOrigin() == wire::CommOrigin::SPLIT) splits.emplace(c.getPid(), c.asReader());
    else parent = c.getCommHash();
  }
  ASSERT_EQ(splits.size(), 2u) << "both members of the split are announced";
  auto without = splits.at(a), with = splits.at(b);
  EXPECT_EQ(without.getHandle(), 0u);
  EXPECT_EQ(without.getSplitColor(), -1);
  EXPECT_EQ(without.getSplitKey(), 4);
  EXPECT_EQ(without.getSplitIndex(), 1);
  EXPECT_EQ(without.getRank(), static_cast<int32_t>(a % 2)) << "named by its parent rank";
  EXPECT_EQ(without.getParentHash(), parent);
  EXPECT_EQ(without.getCommHash(), proto::comm_hash_of_split(parent, 1, -1));
  EXPECT_EQ(with.getHandle(), 0x21u);
  EXPECT_EQ(with.getSplitColor(), 3);
  EXPECT_EQ(with.getSplitKey(), 7);
  EXPECT_EQ(with.getSplitIndex(), 1);
  EXPECT_EQ(with.getRank(), static_cast<int32_t>(b % 2));
  EXPECT_EQ(with.getNranks(), -1) << "no one member knows the child's size";
}

// A killed rank's process is found gone by /proc (the agent's scan) before
// its exit event is read from the ring buffer: the event is still there.
// How it ended must reach the collector all the same ("killed by signal 9"
// in the hang), so it is kept one scan longer for it.
TEST(Summarise, AProcessFoundGoneBeforeItsExitEventIsReadIsReportedWithHowItEnded) {
  testing::TempDir proc;  // an empty /proc: every process is gone
  Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t pid = 100;
  summariser.on_event(init_event(pid, RS_OP_COMM_INIT_RANK, 0x10, 0, 0, 1'000));
  announced(summariser);  // its records went out
  EXPECT_TRUE(summariser.forget_exited().empty()) << "forgotten before its exit event could be read";
  {
    capnp::MallocMessageBuilder message;
    auto heartbeat = message.initRoot<wire::AgentMessage>().initHeartbeat();
    summariser.health(heartbeat, 1'500);
    EXPECT_EQ(heartbeat.getProcesses().size(), 0u) << "reported once, with how it ended, not as 'exited' first";
  }
  rs_exit_event exit{};
  exit.hdr.pid = exit.hdr.tid = pid;
  exit.hdr.kind = RS_EV_EXIT;
  exit.exit_code = 9;  // SIGKILL
  summariser.on_event(exit);
  EXPECT_EQ(summariser.forget_exited(), std::vector<uint32_t>{pid});
  capnp::MallocMessageBuilder message;
  auto heartbeat = message.initRoot<wire::AgentMessage>().initHeartbeat();
  summariser.health(heartbeat, 2'000);
  ASSERT_EQ(heartbeat.getProcesses().size(), 1u);
  EXPECT_FALSE(heartbeat.getProcesses()[0].getAlive());
  EXPECT_EQ(heartbeat.getProcesses()[0].getExitSignal(), 9);

  // One whose exit event never comes (it exited before it was traced, or
  // the ring buffer was full) is forgotten at the scan after.
  summariser.on_event(init_event(pid + 1, RS_OP_COMM_INIT_RANK, 0x11, 0, 0, 3'000));
  announced(summariser);
  EXPECT_TRUE(summariser.forget_exited().empty());
  EXPECT_EQ(summariser.forget_exited(), std::vector<uint32_t>{pid + 1});
  EXPECT_EQ(summariser.traced_processes(), 0u);
}

// A heartbeat no collector took (the collector is down): the exits it
// listed, how each ended and its counters at exit (which bill its last
// interval), are listed again in the next, until one is taken.
TEST(Summarise, AnExitIsListedAgainUntilACollectorTakesAHeartbeat) {
  testing::TempDir proc;  // an empty /proc: every process is gone
  Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  const uint32_t pid = 100;
  summariser.on_event(init_event(pid, RS_OP_COMM_INIT_RANK, 0x10, 0, 0, 1'000));
  announced(summariser);
  rs_exit_event exit{};
  exit.hdr.pid = exit.hdr.tid = pid;
  exit.hdr.kind = RS_EV_EXIT;
  exit.exit_code = 9;
  exit.host.cpu_ns = 7'000;
  summariser.on_event(exit);
  EXPECT_EQ(summariser.forget_exited(), std::vector<uint32_t>{pid});
  auto listed = [&] {
    capnp::MallocMessageBuilder message;
    auto heartbeat = message.initRoot<wire::AgentMessage>().initHeartbeat();
    summariser.health(heartbeat, 2'000);
    std::vector<std::pair<int, uint64_t>> out;  // (signal, CPU at exit)
    for (auto p : heartbeat.getProcesses())
      if (p.getPid() == pid && p.getExitSignal() != 0) out.emplace_back(p.getExitSignal(), p.getHost().getCpuNs());
    return out;
  };
  const std::vector<std::pair<int, uint64_t>> once = {{9, 7'000}};
  EXPECT_EQ(listed(), once);
  EXPECT_EQ(listed(), once) << "a heartbeat no collector took lost the exit";
  summariser.exits_reported();
  EXPECT_TRUE(listed().empty()) << "listed again after a collector took it";
  // The collector restarted (a new hello): what it took last may have gone
  // to the connection it dropped.
  summariser.relist_recent_exits(3'000);
  EXPECT_EQ(listed(), once);
  // Its pid taken by another process, traced since: the old exit is not
  // listed beside it (it could be taken for the new process's last word).
  summariser.exits_reported();
  summariser.on_event(init_event(pid, RS_OP_COMM_INIT_RANK, 0x12, 0, 0, 4'000));
  summariser.relist_recent_exits(4'000);
  EXPECT_TRUE(listed().empty()) << "an old exit listed beside a live process of its pid";
}

// In a fleet the batches go by job: a process that exits is kept until its
// last records went out under its job's key (forgotten first, they would
// have no key to go by and never go).
TEST(Summarise, InAFleetAnExitedProcessIsKeptUntilItsLastRecordsWentOutUnderItsJob) {
  testing::TempDir proc;  // an empty /proc: every process is gone
  Summariser summariser(proc.path(), "gpu-1", testing::unshifted_node_clock());
  summariser.set_keyed(true);
  const uint32_t pid = 100;
  summariser.on_event(init_event(pid, RS_OP_COMM_INIT_RANK, 0x10, 0, 0, 1'000));
  const std::string key = summariser.key_of(pid);
  EXPECT_EQ(key.rfind("job:nccl-", 0), 0u) << key;  // a job id from its first communicator
  capnp::MallocMessageBuilder first;
  summariser.fill(first.initRoot<wire::AgentMessage>().initBatch(), DropCounts{}, key);
  rs_call_event call{};
  call.hdr.pid = call.hdr.tid = pid;
  call.hdr.kind = RS_EV_CALL;
  call.hdr.ts_ns = 2'000;
  call.entry_ns = 1'900;
  call.comm = 0x10;
  call.count = 1024;
  call.op = RS_OP_ALLREDUCE;
  summariser.on_event(call);
  rs_exit_event exit{};
  exit.hdr.pid = exit.hdr.tid = pid;
  exit.hdr.kind = RS_EV_EXIT;
  summariser.on_event(exit);
  EXPECT_TRUE(summariser.forget_exited().empty()) << "its last record has not gone out";
  EXPECT_EQ(summariser.keys(), std::set<std::string>{key});
  EXPECT_TRUE(summariser.pending(key, ""));
  capnp::MallocMessageBuilder last;
  auto batch = last.initRoot<wire::AgentMessage>().initBatch();
  summariser.fill(batch, DropCounts{}, key);
  ASSERT_EQ(batch.getCollectives().size(), 1u);
  EXPECT_EQ(batch.getCollectives()[0].getCount(), 1u);
  EXPECT_FALSE(summariser.pending(key, ""));
  EXPECT_EQ(summariser.forget_exited(), std::vector<uint32_t>{pid});
  EXPECT_TRUE(summariser.empty());
}

}  // namespace
}  // namespace rankscope::agent
