// The agent's BPF probes on NVIDIA's real libnccl.so.2: a child process calls
// the real library with known arguments (there is no GPU, so the calls fail,
// but they are made with real arguments through the real ABI) and every
// decoded field is compared with what was passed.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <variant>
#include <vector>

#include "node-agent/attach.h"
#include "node-agent/drain.h"
#include "tests/support/harness.h"

namespace {

constexpr const char* kRealNccl = "/usr/local/cuda/lib/libnccl.so.2";

struct Expected {
  uint8_t op;
  uint64_t count;
  uint8_t datatype;
  uint8_t redop;
  int32_t peer;
  uint64_t stream;  // passed, not recorded (the agent does not read it)
};

// Every collective and point-to-point call, with arguments chosen so that
// each field differs from its neighbours (a shifted register would show).
const Expected kCalls[] = {
    {RS_OP_ALLREDUCE, 1001, ncclFloat32, ncclMax, -1, 0x5101},
    {RS_OP_BROADCAST, 77, ncclInt64, 0, 3, 0x5102},
    {RS_OP_BCAST, 5, ncclUint8, 0, 1, 0x5103},
    {RS_OP_REDUCE, 300, ncclFloat16, ncclProd, 2, 0x5104},
    {RS_OP_ALLGATHER, 64, ncclBfloat16, 0, -1, 0x5105},
    {RS_OP_REDUCESCATTER, 128, ncclFloat64, ncclMin, -1, 0x5106},
    {RS_OP_ALLTOALL, 32, ncclInt32, 0, -1, 0x5107},
    {RS_OP_GATHER, 16, ncclUint32, 0, 1, 0x5108},
    {RS_OP_SCATTER, 8, ncclInt8, 0, 0, 0x5109},
    {RS_OP_SEND, 4096, ncclFloat32, 0, 3, 0x510a},
    {RS_OP_RECV, 2048, ncclUint64, 0, 1, 0x510b},
};

ncclUniqueId known_id(int salt) {
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id.internal[i] = static_cast<char>(i * 7 + salt);
  return id;
}

// Runs in the child: the calls, through dlsym so that the real library is
// used whatever the test binary links. Writes each return code to `out`.
[[noreturn]] void child_main(int go_fd, int out_fd, void* fake_comm) {
  char c;
  if (read(go_fd, &c, 1) != 1) _exit(10);
  void* lib = dlopen(kRealNccl, RTLD_NOW);
  if (!lib) _exit(11);
#define SYM(name) reinterpret_cast<decltype(&name)>(dlsym(lib, #name))
  auto comm = static_cast<ncclComm_t>(fake_comm);
  auto s = [](const Expected& e) { return reinterpret_cast<cudaStream_t>(e.stream); };
  std::vector<int> results;
  ncclComm_t out_comm = nullptr;
  results.push_back(SYM(ncclCommInitRank)(&out_comm, 4, known_id(1), 2));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  results.push_back(SYM(ncclCommInitRankConfig)(&out_comm, 8, known_id(3), 5, &config));
  const Expected* e = kCalls;
  results.push_back(SYM(ncclAllReduce)(nullptr, nullptr, e[0].count, ncclFloat32, ncclMax, comm, s(e[0])));
  results.push_back(SYM(ncclBroadcast)(nullptr, nullptr, e[1].count, ncclInt64, 3, comm, s(e[1])));
  results.push_back(SYM(ncclBcast)(nullptr, e[2].count, ncclUint8, 1, comm, s(e[2])));
  results.push_back(SYM(ncclReduce)(nullptr, nullptr, e[3].count, ncclFloat16, ncclProd, 2, comm, s(e[3])));
  results.push_back(SYM(ncclAllGather)(nullptr, nullptr, e[4].count, ncclBfloat16, comm, s(e[4])));
  results.push_back(SYM(ncclReduceScatter)(nullptr, nullptr, e[5].count, ncclFloat64, ncclMin, comm, s(e[5])));
  results.push_back(SYM(ncclAlltoAll)(nullptr, nullptr, e[6].count, ncclInt32, comm, s(e[6])));
  results.push_back(SYM(ncclGather)(nullptr, nullptr, e[7].count, ncclUint32, 1, comm, s(e[7])));
  results.push_back(SYM(ncclScatter)(nullptr, nullptr, e[8].count, ncclInt8, 0, comm, s(e[8])));
  results.push_back(SYM(ncclSend)(nullptr, e[9].count, ncclFloat32, 3, comm, s(e[9])));
  results.push_back(SYM(ncclRecv)(nullptr, e[10].count, ncclUint64, 1, comm, s(e[10])));
#undef SYM
  for (int r : results)
    if (write(out_fd, &r, sizeof(r)) != sizeof(r)) _exit(12);
  if (read(go_fd, &c, 1) != 1) _exit(13);  // exit when told
  _exit(0);
}

TEST(RealNccl, AgentDecodesEveryArgumentOfTheRealLibrary) {
  if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  ASSERT_EQ(access(kRealNccl, R_OK), 0) << kRealNccl << " is part of this machine's CUDA install";
  // A zeroed block stands in for a communicator: NCCL reads its magic
  // numbers, finds them wrong and returns ncclInvalidArgument without using it.
  void* fake_comm = calloc(1, 64 << 20);
  int go[2], out[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(out), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) child_main(go[0], out[1], fake_comm);
  close(go[0]);
  close(out[1]);
  struct Reap {
    pid_t pid;
    ~Reap() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{child};

  rankscope::agent::Scope scope;
  scope.pids = {static_cast<uint32_t>(child)};
  std::vector<rankscope::agent::Event> events;
  std::vector<rs_exit_event> exits;
  auto probes = rankscope::agent::NcclProbes::open(scope, [&](const void* data, size_t size) {
    auto event = rankscope::agent::decode_event(data, size);
    ASSERT_TRUE(event.has_value()) << "undecodable record of " << size << " bytes";
    if (auto* exit = std::get_if<rs_exit_event>(&*event))
      exits.push_back(*exit);
    else
      events.push_back(*event);
  });
  ASSERT_TRUE(probes) << probes.error().message;
  auto library = rankscope::agent::Discovery::from_path(kRealNccl);
  ASSERT_TRUE(library);
  auto attached = (*probes)->attach(*library);
  ASSERT_TRUE(attached) << attached.error().message;
  EXPECT_TRUE(attached->missing.empty());

  ASSERT_EQ(write(go[1], "g", 1), 1);
  std::vector<int> results(2 + std::size(kCalls));
  // The child writes one result at a time: read until all are in.
  size_t got = 0;
  const size_t want = results.size() * sizeof(int);
  while (got < want) {
    ssize_t n = read(out[0], reinterpret_cast<char*>(results.data()) + got, want - got);
    ASSERT_GT(n, 0) << "the child stopped after " << got << " of " << want << " bytes";
    got += static_cast<size_t>(n);
  }
  const size_t expected_events = results.size();
  ASSERT_TRUE(rankscope::testing::wait_for(
      [&] {
        (*probes)->poll(20);
        return events.size() >= expected_events;
      },
      std::chrono::seconds(10)))
      << "got " << events.size() << " of " << expected_events << " events";
  (*probes)->poll(100);
  ASSERT_EQ(events.size(), expected_events) << "ncclBcast calls ncclBroadcast inside NCCL: it must count once";

  // Communicator creation: nranks, rank and the 128-byte id passed by value on the stack.
  struct InitCase {
    uint8_t op;
    int nranks, rank, salt;
  } inits[] = {{RS_OP_COMM_INIT_RANK, 4, 2, 1}, {RS_OP_COMM_INIT_RANK_CONFIG, 8, 5, 3}};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    auto* init = std::get_if<rs_comm_init_event>(&events[i]);
    ASSERT_NE(init, nullptr);
    EXPECT_EQ(init->hdr.pid, static_cast<uint32_t>(child));
    EXPECT_EQ(init->op, inits[i].op);
    EXPECT_EQ(init->nranks, inits[i].nranks);
    EXPECT_EQ(init->rank, inits[i].rank);
    EXPECT_EQ(init->result, results[i]);
    EXPECT_NE(init->result, 0) << "no GPU here: the real library must fail";
    EXPECT_EQ(init->comm, 0u);
    ncclUniqueId id = known_id(inits[i].salt);
    EXPECT_EQ(memcmp(init->unique_id, id.internal, NCCL_UNIQUE_ID_BYTES), 0);
    EXPECT_LE(init->entry_ns, init->hdr.ts_ns);
  }
  for (size_t i = 0; i < std::size(kCalls); ++i) {
    const Expected& want = kCalls[i];
    SCOPED_TRACE("call " + std::to_string(i));
    auto* call = std::get_if<rs_call_event>(&events[2 + i]);
    ASSERT_NE(call, nullptr);
    EXPECT_EQ(call->hdr.pid, static_cast<uint32_t>(child));
    EXPECT_EQ(call->op, want.op);
    EXPECT_EQ(call->count, want.count);
    EXPECT_EQ(call->datatype, want.datatype);
    EXPECT_EQ(call->redop, want.redop);
    EXPECT_EQ(call->peer, want.peer);
    EXPECT_EQ(call->comm, reinterpret_cast<uint64_t>(fake_comm));
    EXPECT_EQ(call->result, results[2 + i]);
    EXPECT_EQ(call->result, ncclInvalidArgument);
    EXPECT_TRUE(call->flags & RS_CALL_UNKNOWN_COMM);
    EXPECT_LE(call->entry_ns, call->hdr.ts_ns);
    if (want.op == RS_OP_SEND || want.op == RS_OP_RECV)
      EXPECT_EQ(call->lane, RS_P2P_LANE(want.peer, want.op == RS_OP_RECV));
    else
      EXPECT_EQ(call->lane, 0u);
  }
  // Lane 0 numbers the collectives in call order.
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(std::get<rs_call_event>(events[2 + i]).seq, i);

  // While it lives, its communicator (unknown to NCCL, numbered anyway) is
  // in the BPF tables; once it exits, nothing of it is left there.
  // Its exit walks `comms` and `p2p_seqs` only where they hold entries of
  // it: here both (a communicator never destroyed, a Send and a Recv lane).
  auto live = (*probes)->table_entries(child);
  EXPECT_EQ(live.comms, 1u);
  EXPECT_EQ(live.p2p, 2u);
  ASSERT_EQ(write(go[1], "x", 1), 1);

  // A process that used NCCL is seen exiting, with its status (_exit(0)).
  ASSERT_TRUE(rankscope::testing::wait_for(
      [&] {
        (*probes)->poll(20);
        return !exits.empty();
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(exits[0].hdr.pid, static_cast<uint32_t>(child));
  EXPECT_EQ(exits[0].exit_code, 0);
  auto left = (*probes)->table_entries(child);
  EXPECT_EQ(left.comms + left.p2p + left.waits + left.threads, 0u);
  EXPECT_FALSE(left.processes);
  free(fake_comm);
}

}  // namespace
