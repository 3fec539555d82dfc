// The agent's reader of the profiler plugin's rings (node-agent/profiler_rings.h):
// rings made as the plugin makes them (a sealed memfd) in this process, found
// through a fake /proc root whose PID entry is this process's own, and
// written as the plugin writes them.
#include "node-agent/profiler_rings.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <tuple>
#include <vector>

#include "bpf/nccl_events.h"
#include "nccl-profiler/abi.h"
#include "tests/support/harness.h"

namespace rankscope::agent {
namespace {

using profiler::Record;
using profiler::RecordKind;

constexpr uint32_t kPid = 4242;
constexpr uint64_t kStart = 777;
constexpr uint64_t kComm = 0x1234abcd5678ef01ull;
constexpr uint32_t kSlots = 64;

// A process's ring where the agent looks for it: a memfd among PROC/PID/fd.
// PROC/PID is this process (a link to /proc/self), so one FakeRing lives at
// a time.
class FakeRing {
 public:
  FakeRing(const testing::TempDir& proc, uint32_t pid, uint64_t start_time, uint32_t version = profiler::kRingVersion,
           int seals = profiler::kRingSeals) {
    std::filesystem::path entry = std::filesystem::path(proc.path()) / std::to_string(pid);
    std::filesystem::remove(entry);
    std::filesystem::create_directory_symlink("/proc/self", entry);
    fd = memfd_create(profiler::kRingMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    bytes = profiler::ring_bytes(kSlots);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    view.header = static_cast<profiler::RingHeader*>(map);
    view.records = reinterpret_cast<Record*>(static_cast<char*>(map) + sizeof(profiler::RingHeader));
    profiler::ring_init(view, kSlots, pid, start_time);
    view.header->version = version;
  }
  ~FakeRing() {
    munmap(map, bytes);
    close(fd);
  }
  // As the plugin writes one record.
  bool write(RecordKind kind, uint64_t seq, uint64_t host_ns, uint64_t gpu_ns, uint8_t channel = 0,
             uint8_t state = 0, uint8_t op = RS_OP_ALLREDUCE) {
    Record r;
    r.comm_hash = kComm;
    r.seq_number = seq;
    r.host_ns = host_ns;
    r.gpu_ns = gpu_ns;
    r.bytes = 1024;
    r.rank = 3;
    r.peer = -1;
    r.event = 0;
    r.kind = kind;
    r.op = op;
    r.channel = channel;
    r.state = state;
    return profiler::ring_write(view, r);
  }
  // As the plugin writes one proxy record of rank 3 (an operation's or a step's).
  // An enqueue record in communicator `comm`.
  bool write_in(uint64_t comm, RecordKind kind, uint64_t seq, uint64_t host_ns) {
    Record r{};
    r.comm_hash = comm;
    r.seq_number = seq;
    r.host_ns = host_ns;
    r.rank = 3;
    r.peer = -1;
    r.kind = kind;
    r.op = RS_OP_ALLREDUCE;
    r.channel = 1;
    return profiler::ring_write(view, r);
  }
  bool proxy(RecordKind kind, uint64_t seq, uint64_t host_ns, uint32_t event, int32_t peer, uint8_t channel,
             uint8_t state) {
    Record r{};
    r.comm_hash = kComm;
    r.seq_number = seq;
    r.host_ns = host_ns;
    r.rank = 3;
    r.peer = peer;
    r.event = event;
    r.kind = kind;
    r.op = RS_OP_ALLREDUCE;
    r.channel = channel;
    r.state = state;
    return profiler::ring_write(view, r);
  }
  int fd = -1;
  void* map = nullptr;
  size_t bytes = 0;
  profiler::RingView view;
};

TEST(ProfilerRings, ACollectiveIsReportedOnceEveryChannelsKernelStoppedOnTheHostClock) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  EXPECT_FALSE(ring.write(RecordKind::coll_start, 0, 100, 0, 2)) << "nobody reads yet: dropped";
  ProfilerRings rings(proc.path());
  ASSERT_TRUE(rings.attach(kPid, kStart));
  EXPECT_NE(ring.view.header->reader.load(), 0u) << "attaching marks the ring read";

  // Collective #5, two channels: the GPU timer reads 4,000 ns behind the host's
  // monotonic clock (the plugin hears of a kernel 0-20 ns after it started).
  ASSERT_TRUE(ring.write(RecordKind::coll_start, 5, 1'000, 0, /*nChannels=*/2));
  ASSERT_TRUE(ring.write(RecordKind::coll_stop, 5, 1'100, 0, 2));
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 5, 5'020, 1'000, 0));
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 5, 5'030, 1'030, 1));
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 5, 6'500, 2'000, 0));
  std::vector<GpuCollective> got;
  auto keep = [&](const GpuCollective& c) { got.push_back(c); };
  rings.drain(keep);
  EXPECT_TRUE(got.empty()) << "one channel still runs";
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 5, 6'600, 2'100, 1));
  rings.drain(keep);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].pid, kPid);
  EXPECT_EQ(got[0].comm_hash, kComm);
  EXPECT_EQ(got[0].rank, 3);
  EXPECT_EQ(got[0].op, RS_OP_ALLREDUCE);
  EXPECT_EQ(got[0].seq_number, 5u);
  EXPECT_EQ(got[0].enqueued_ns, 1'000u);
  EXPECT_EQ(got[0].kernel_start_ns, 5'000u) << "the first channel's start, on the host clock (offset 4,000)";
  EXPECT_EQ(got[0].kernel_end_ns, 6'100u) << "the last channel's stop";
  EXPECT_EQ(rings.counts().records, 6u);
  EXPECT_EQ(rings.counts().plugin_dropped, 0u) << "the drop before attaching was before the agent's time";
  EXPECT_EQ(rings.counts().unmatched, 0u);
}

// Sends and Recvs (numbered by the plugin per op: NCCL gives them no
// seqNumber) are reported too, for their kernels' ends, each once its
// kernels stopped, in whatever order they finish (to different peers they
// do not finish in order); they are not where a GPU is stuck for the hangs,
// and one without the plugin's number (an older plugin) is not read.
TEST(ProfilerRings, SendsAndRecvsAreReportedForTheirKernelsEndsInAnyOrder) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  ASSERT_TRUE(rings.attach(kPid, kStart));
  ASSERT_TRUE(ring.write(RecordKind::p2p_start, 1, 1'000, 0, 1, 0, RS_OP_SEND));
  ASSERT_TRUE(ring.write(RecordKind::p2p_start, 2, 1'100, 0, 1, 0, RS_OP_SEND));
  ASSERT_TRUE(ring.write(RecordKind::p2p_start, 1, 1'200, 0, 1, 0, RS_OP_RECV));
  ASSERT_TRUE(ring.write(RecordKind::p2p_start, 0, 1'300, 0, 1, 0, RS_OP_RECV));  // no number: not read
  for (auto [op, seq] : {std::pair{RS_OP_SEND, 1}, {RS_OP_SEND, 2}, {RS_OP_RECV, 1}})
    ASSERT_TRUE(ring.write(RecordKind::kernel_start, seq, 5'000, 1'000, 0, 0, op));
  std::vector<GpuCollective> got;
  auto keep = [&](const GpuCollective& c) { got.push_back(c); };
  rings.drain(keep);
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(rings.open().empty()) << "Sends and Recvs are not collectives a GPU is stuck in";
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 2, 6'000, 2'000, 0, 0, RS_OP_SEND));  // #2 before #1
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 1, 9'000, 5'000, 0, 0, RS_OP_RECV));
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 1, 7'000, 3'000, 0, 0, RS_OP_SEND));
  rings.drain(keep);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].op, RS_OP_SEND);
  EXPECT_EQ(got[0].seq_number, 2u);
  EXPECT_EQ(got[0].kernel_end_ns, 6'000u);
  EXPECT_EQ(got[1].op, RS_OP_RECV);
  EXPECT_EQ(got[1].kernel_end_ns, 9'000u) << "a Recv that waited for its data ends late";
  EXPECT_EQ(got[2].op, RS_OP_SEND);
  EXPECT_EQ(got[2].seq_number, 1u) << "not dropped for finishing after #2";
  EXPECT_EQ(got[2].enqueued_ns, 1'000u);
}

TEST(ProfilerRings, ARingOfAnotherProcessOrLayoutIsNotRead) {
  testing::TempDir proc;
  {
    FakeRing reused(proc, kPid, kStart + 1);  // the pid's earlier process left it
    ProfilerRings rings(proc.path());
    EXPECT_FALSE(rings.attach(kPid, kStart));
    EXPECT_EQ(reused.view.header->reader.load(), 0u);
    EXPECT_EQ(rings.counts().refused, 1u);
  }
  ProfilerRings rings(proc.path());
  {
    FakeRing other(proc, kPid + 1, kStart, profiler::kRingVersion + 1);
    EXPECT_FALSE(rings.attach(kPid + 1, kStart)) << "another plugin build's layout";
    EXPECT_EQ(other.view.header->reader.load(), 0u);
  }
  {
    // A ring its writer could shrink under the agent's mapping (SIGBUS in the agent).
    FakeRing unsealed(proc, kPid + 2, kStart, profiler::kRingVersion, F_SEAL_SEAL);
    EXPECT_FALSE(rings.attach(kPid + 2, kStart)) << "a ring not sealed against resizing";
    // Its plugin might be making it: looked at again at each drain, a while.
    for (int i = 0; i < 40; ++i) rings.drain([](const GpuCollective&) {});
    EXPECT_EQ(unsealed.view.header->reader.load(), 0u);
  }
  EXPECT_FALSE(rings.attach(kPid + 3, kStart)) << "no such process";
  EXPECT_EQ(rings.counts().refused, 2u);
  {
    FakeRing good(proc, kPid + 1, kStart);
    EXPECT_FALSE(rings.attach(kPid + 1, kStart)) << "a refused process is not looked at again";
    rings.detach(kPid + 1, [](const GpuCollective&) {});  // it exited; its pid may come back
    EXPECT_TRUE(rings.attach(kPid + 1, kStart));
  }
}

// The plugin makes its ring in steps (a memfd, sized, sealed, mapped, its
// header written last): the agent may look in between. Such a ring is
// looked at again at the next drains and read once made, not refused for
// the process's life (which left its job without a GPU side).
TEST(ProfilerRings, ARingFoundWhileItsPluginMakesItIsReadOnceMade) {
  testing::TempDir proc;
  auto ignore = [](const GpuCollective&) {};
  {
    FakeRing ring(proc, kPid, kStart, profiler::kRingVersion, /*seals=*/0);  // not sealed yet
    ProfilerRings rings(proc.path());
    EXPECT_FALSE(rings.attach(kPid, kStart));
    ASSERT_EQ(fcntl(ring.fd, F_ADD_SEALS, profiler::kRingSeals), 0);
    rings.drain(ignore);
    EXPECT_EQ(rings.counts().rings, 1u);
    EXPECT_EQ(rings.counts().refused, 0u);
    EXPECT_NE(ring.view.header->reader.load(), 0u);
  }
  {
    FakeRing ring(proc, kPid + 1, kStart);
    const uint32_t magic = ring.view.header->magic;
    ring.view.header->magic = 0;  // its header not written yet
    ProfilerRings rings(proc.path());
    EXPECT_FALSE(rings.attach(kPid + 1, kStart));
    ring.view.header->magic = magic;
    rings.drain(ignore);
    EXPECT_EQ(rings.counts().rings, 1u);
    EXPECT_EQ(rings.counts().refused, 0u);
  }
}

// Where a stopped GPU is stuck: per communicator and op, the oldest
// collective enqueued whose kernels have not all stopped, and whether any
// started; a completed one clears those before it (a stream runs them in order).
TEST(ProfilerRings, TheOldestUnfinishedCollectiveIsWhereAGpuIsStuck) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  ASSERT_TRUE(rings.attach(kPid, kStart));
  auto ignore = [](const GpuCollective&) {};
  for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(ring.write(RecordKind::coll_start, seq, 1'000 * seq, 0, 1));
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 1, 5'000, 1'000, 0));  // GPU clock 4,000 behind
  rings.drain(ignore);
  auto open = rings.open();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].pid, kPid);
  EXPECT_EQ(open[0].comm_hash, kComm);
  EXPECT_EQ(open[0].seq_number, 1u);
  EXPECT_EQ(open[0].enqueued_ns, 1'000u);
  EXPECT_EQ(open[0].kernel_start_ns, 5'000u);
  // #2 runs to the end (#1's stop was lost to a full ring, say): #1 is done too.
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 2, 6'000, 2'000, 0));
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 2, 7'000, 3'000, 0));
  size_t done = 0;
  rings.drain([&](const GpuCollective&) { ++done; });
  EXPECT_EQ(done, 1u);
  open = rings.open();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].seq_number, 3u);
  EXPECT_EQ(open[0].kernel_start_ns, 0u) << "its kernels never started";
}

TEST(ProfilerRings, AWriterThatNeverStopsCannotHoldTheReader) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  ASSERT_TRUE(rings.attach(kPid, kStart));
  // The writer also rewrites its header's size; the reader keeps its own.
  ring.view.header->slots = 1u << 30;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t seq = 0; !stop.load(); ++seq) ring.write(RecordKind::coll_start, seq, seq, 0, 1);
  });
  for (int i = 0; i < 100; ++i) rings.drain([](const GpuCollective&) {});  // each returns
  stop = true;
  writer.join();
  EXPECT_LE(rings.counts().records, 100u * kSlots);
}

TEST(ProfilerRings, AnExitedProcessIsDrainedAndItsRingLetGo) {
  testing::TempDir proc;
  ProfilerRings rings(proc.path());
  {
    FakeRing ring(proc, kPid, kStart);
    ASSERT_TRUE(rings.attach(kPid, kStart));
    ASSERT_TRUE(ring.write(RecordKind::coll_start, 0, 10, 0, 1));
    ASSERT_TRUE(ring.write(RecordKind::kernel_start, 0, 20, 15, 0));
    ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 0, 40, 30, 0));
    size_t got = 0;
    rings.detach(kPid, [&](const GpuCollective&) { ++got; });
    EXPECT_EQ(got, 1u);
    EXPECT_EQ(rings.counts().rings, 0u);
  }
  // Later drops (the ring full, say) are counted while it is read.
  FakeRing again(proc, kPid + 1, kStart);
  ASSERT_TRUE(rings.attach(kPid + 1, kStart));
  for (uint32_t i = 0; i < kSlots + 3; ++i) again.write(RecordKind::coll_start, i, i, 0, 1);
  rings.drain([](const GpuCollective&) {});
  EXPECT_EQ(rings.counts().plugin_dropped, 3u);
}

// NCCL's proxy steps (while the agent asks for them): per collective, the
// send link that waited longest on the network, a link being its busiest
// channel (each channel's overlapping steps once). A collective is held
// until its proxy operations stopped; one whose stop never came is sent
// when its process exits. Steps with no peer (a hostile writer) count for
// nothing.
TEST(ProfilerRings, ProxyStepsGiveEachCollectiveTheSendLinkThatWaitedLongest) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  rings.set_detail(true);
  ASSERT_TRUE(rings.attach(kPid, kStart));
  EXPECT_EQ(ring.view.header->detail.load(), 1u) << "the agent asks for proxy events";
  std::vector<GpuCollective> got;
  auto keep = [&](const GpuCollective& c) { got.push_back(c); };
  auto proxy = [&](auto... args) { ASSERT_TRUE(ring.proxy(args...)); };
  const uint8_t send = profiler::kProxySend, wait = profiler::abi::kProxyStepSendWait;
  // Collective #1 on two channels, each with a send operation to rank 1.
  ASSERT_TRUE(ring.write(RecordKind::coll_start, 1, 1'000, 0, 2));
  proxy(RecordKind::proxy_op_start, 1, 1'100, 10, 1, 0, send);
  proxy(RecordKind::proxy_op_start, 1, 1'100, 11, 1, 1, send);
  // Channel 0: steps [2,000, 6,000] and [4,000, 7,000] overlap: 5,000.
  // Channel 1: [8,000, 9,000], its stop read between channel 0's two.
  const std::vector<std::tuple<uint32_t, uint8_t, uint64_t, uint64_t>> steps = {
      {100, 0, 2'000, 6'000}, {101, 1, 8'000, 9'000}, {102, 0, 4'000, 7'000}};
  for (auto [event, channel, posted, done] : steps) {
    proxy(RecordKind::proxy_step, 1, posted - 10, event, 1, channel, send);
    proxy(RecordKind::proxy_step, 1, posted, event, 1, channel, send | wait);
  }
  for (auto [event, channel, posted, done] : steps) proxy(RecordKind::proxy_step_stop, 1, done, event, 1, channel, send);
  rings.drain(keep);
  // A step to no peer, 1 s long: nothing.
  proxy(RecordKind::proxy_step, 1, 7'000, 103, -1, 1, send);
  proxy(RecordKind::proxy_step, 1, 7'000, 103, -1, 1, send | wait);
  proxy(RecordKind::proxy_step_stop, 1, 1'000'007'000, 103, -1, 1, send);
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 1, 2'000, 2'000, 0));
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 1, 2'000, 2'000, 1));
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 1, 6'500, 6'500, 0));
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 1, 6'500, 6'500, 1));
  proxy(RecordKind::proxy_op_stop, 1, 6'600, 10, 1, 0, send);
  rings.drain(keep);
  EXPECT_TRUE(got.empty()) << "a proxy operation still moves its data";
  proxy(RecordKind::proxy_op_stop, 1, 9'100, 11, 1, 1, send);
  rings.drain(keep);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].link_peer, 1);
  EXPECT_EQ(got[0].link_wait_ns, 5'000u) << "its busiest channel, 0: its steps, overlapping ones once";
  EXPECT_TRUE(rings.open().empty()) << "its kernels are not open";

  // Collective #2: its proxy operation's stop is lost; it is sent when the process exits.
  ASSERT_TRUE(ring.write(RecordKind::coll_start, 2, 8'000, 0, 1));
  proxy(RecordKind::proxy_op_start, 2, 8'100, 12, 1, 0, send);
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 2, 9'000, 9'000, 0));
  ASSERT_TRUE(ring.write(RecordKind::kernel_stop, 2, 9'500, 9'500, 0));
  rings.drain(keep);
  EXPECT_EQ(got.size(), 1u);
  rings.detach(kPid, keep);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].seq_number, 2u);
  EXPECT_EQ(got[1].link_peer, -1) << "no step of it was seen";
}

// Detail on demand: the collector names the communicators whose proxy
// steps it wants; the plugin of a process in one of them is asked, the
// others' are not, and a request that no longer names it turns them off.
TEST(ProfilerRings, ProxyStepsAreAskedOfTheProcessesInTheCommunicatorsNamed) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  ASSERT_TRUE(rings.attach(kPid, kStart));
  rings.set_detail(false, {kComm});
  EXPECT_EQ(ring.view.header->detail.load(), 0u) << "its communicators are not known before its first collective";
  ASSERT_TRUE(ring.write(RecordKind::coll_start, 1, 1'000, 0, 1));
  rings.drain([](const GpuCollective&) {});
  EXPECT_EQ(ring.view.header->detail.load(), 1u) << "asked once a collective of a named communicator is seen";
  EXPECT_EQ(rings.detailed(), 1u);
  rings.set_detail(false, {kComm + 1});
  EXPECT_EQ(ring.view.header->detail.load(), 0u) << "another communicator named: not this process";
  rings.set_detail(false, {kComm + 1, kComm});
  EXPECT_EQ(ring.view.header->detail.load(), 1u);
  rings.set_detail(false, {});
  EXPECT_EQ(ring.view.header->detail.load(), 0u);
  EXPECT_EQ(rings.detailed(), 0u);
  rings.set_detail(true, {});
  EXPECT_EQ(ring.view.header->detail.load(), 1u) << "the background sample asks every process";
}

// A process that makes a communicator per step (and destroys it) is still
// asked for the newest one's proxy steps after thousands: the least
// recently used communicators are the ones forgotten.
TEST(ProfilerRings, AProcessThatMakesACommunicatorPerStepIsAskedForItsNewestOne) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  ASSERT_TRUE(rings.attach(kPid, kStart));
  constexpr uint64_t kSteps = 3000;
  for (uint64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(ring.write_in(kComm + 1 + step, RecordKind::coll_start, 1, 1'000 + step));
    if (step % 32 == 31) rings.drain([](const GpuCollective&) {});  // the ring holds 64
  }
  rings.drain([](const GpuCollective&) {});
  rings.set_detail(false, {kComm + kSteps});
  EXPECT_EQ(ring.view.header->detail.load(), 1u) << "its newest communicator is known";
  rings.set_detail(false, {kComm + 1});
  EXPECT_EQ(ring.view.header->detail.load(), 0u) << "its first is long forgotten";
}

// A collective whose kernels never stop (a hang) reports, while it is open,
// its send step handed to the network longest ago and not done: a link that
// stopped moving. Steps handed over and done, or not yet handed over, do
// not count.
TEST(ProfilerRings, AnOpenCollectiveNamesItsSendStepThatStoppedMoving) {
  testing::TempDir proc;
  FakeRing ring(proc, kPid, kStart);
  ProfilerRings rings(proc.path());
  rings.set_detail(true);
  ASSERT_TRUE(rings.attach(kPid, kStart));
  auto proxy = [&](RecordKind kind, uint64_t seq, uint64_t host_ns, uint32_t event, int32_t peer, uint8_t state) {
    ASSERT_TRUE(ring.proxy(kind, seq, host_ns, event, peer, 0, state));
  };
  const uint8_t send = profiler::kProxySend, wait = profiler::abi::kProxyStepSendWait;
  ASSERT_TRUE(ring.write(RecordKind::coll_start, 7, 1'000, 0, 1, profiler::kCollDetail));  // scheduled with detail
  ASSERT_TRUE(ring.write(RecordKind::kernel_start, 7, 2'000, 2'000, 0));
  proxy(RecordKind::proxy_op_start, 7, 2'100, 10, 4, send);
  proxy(RecordKind::proxy_step, 7, 2'200, 100, 4, send);  // to rank 4: handed over, done
  proxy(RecordKind::proxy_step, 7, 2'300, 100, 4, send | wait);
  proxy(RecordKind::proxy_step_stop, 7, 2'900, 100, 4, send);
  proxy(RecordKind::proxy_step, 7, 3'000, 101, 4, send);  // handed over at 3,100, never done
  proxy(RecordKind::proxy_step, 7, 3'100, 101, 4, send | wait);
  proxy(RecordKind::proxy_step, 7, 3'200, 102, 4, send);  // waits for the GPU's data: not the link's
  proxy(RecordKind::proxy_step, 7, 3'300, 103, 2, send);  // to rank 2: handed over later
  proxy(RecordKind::proxy_step, 7, 3'400, 103, 2, send | wait);
  rings.drain([](const GpuCollective&) { ADD_FAILURE() << "its kernels never stopped"; });
  auto open = rings.open();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].seq_number, 7u);
  EXPECT_TRUE(open[0].detail);
  EXPECT_TRUE(open[0].proxy_steps);
  EXPECT_EQ(open[0].send_peer, 4);
  EXPECT_EQ(open[0].send_since_ns, 3'100u);

  // The same with no proxy steps asked for: nothing is known of its links.
  FakeRing quiet(proc, kPid + 1, kStart);
  ProfilerRings plain(proc.path());
  ASSERT_TRUE(plain.attach(kPid + 1, kStart));
  ASSERT_TRUE(quiet.write(RecordKind::coll_start, 8, 1'000, 0, 1));
  ASSERT_TRUE(quiet.write(RecordKind::kernel_start, 8, 2'000, 2'000, 0));
  plain.drain([](const GpuCollective&) {});
  open = plain.open();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_FALSE(open[0].detail);
  EXPECT_FALSE(open[0].proxy_steps);
  EXPECT_EQ(open[0].send_peer, -1);
}

}  // namespace
}  // namespace rankscope::agent
