// librankscope-nccl-profiler.so as NCCL sees it: loaded with dlopen, its
// table found by NCCL's symbol names (v5 first, then v4), every struct laid
// out as NCCL's, and its events arriving in the process's ring in the order
// NCCL reports them.
//
// The sizes and offsets below are facts of NCCL's public plugin headers
// (NVIDIA/nccl, plugins/profiler/example/nccl/profiler_v5.h and
// profiler_v4.h, compiled for x86-64): NCCL passes these structs by pointer,
// so one byte off reads the wrong field.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "bpf/nccl_events.h"
#include "nccl-profiler/abi.h"
#include "nccl-profiler/ring.h"

namespace rankscope::profiler {
namespace {

using namespace abi;

TEST(ProfilerAbi, EveryStructHasNcclsSizeAndOffsets) {
  EXPECT_EQ(sizeof(EventDescrV5), 112u);
  EXPECT_EQ(offsetof(EventDescrV5, type), 0u);
  EXPECT_EQ(offsetof(EventDescrV5, parent), 8u);
  EXPECT_EQ(offsetof(EventDescrV5, rank), 16u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.seq_number), 24u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.func), 32u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.count), 56u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.root), 64u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.datatype), 72u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.n_channels), 80u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.d.algo), 88u);
  EXPECT_EQ(offsetof(EventDescrV5, coll.parent_group), 104u);
  EXPECT_EQ(offsetof(EventDescrV5, p2p.d.func), 24u);
  EXPECT_EQ(offsetof(EventDescrV5, p2p.d.datatype), 40u);
  EXPECT_EQ(offsetof(EventDescrV5, p2p.d.count), 48u);
  EXPECT_EQ(offsetof(EventDescrV5, p2p.d.peer), 56u);
  EXPECT_EQ(offsetof(EventDescrV5, p2p.d.n_channels), 60u);
  EXPECT_EQ(offsetof(EventDescrV5, p2p.parent_group), 64u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_op.pid), 24u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_op.channel_id), 28u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_op.peer), 32u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_op.n_steps), 36u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_op.chunk_size), 40u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_op.is_send), 44u);
  EXPECT_EQ(offsetof(EventDescrV5, proxy_step.step), 24u);
  EXPECT_EQ(offsetof(EventDescrV5, kernel_ch.channel_id), 24u);
  EXPECT_EQ(offsetof(EventDescrV5, kernel_ch.gpu_start_ns), 32u);
  EXPECT_EQ(offsetof(EventDescrV5, coll_api.graph_captured), 64u);

  EXPECT_EQ(sizeof(EventDescrV4), 104u);
  EXPECT_EQ(offsetof(EventDescrV4, type), 0u);
  EXPECT_EQ(offsetof(EventDescrV4, parent), 8u);
  EXPECT_EQ(offsetof(EventDescrV4, rank), 16u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.seq_number), 24u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.func), 32u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.count), 56u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.root), 64u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.datatype), 72u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.n_channels), 80u);
  EXPECT_EQ(offsetof(EventDescrV4, coll.algo), 88u);
  EXPECT_EQ(offsetof(EventDescrV4, p2p.func), 24u);
  EXPECT_EQ(offsetof(EventDescrV4, p2p.datatype), 40u);
  EXPECT_EQ(offsetof(EventDescrV4, p2p.count), 48u);
  EXPECT_EQ(offsetof(EventDescrV4, p2p.peer), 56u);
  EXPECT_EQ(offsetof(EventDescrV4, p2p.n_channels), 60u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_op.pid), 24u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_op.channel_id), 28u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_op.peer), 32u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_op.n_steps), 36u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_op.chunk_size), 40u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_op.is_send), 44u);
  EXPECT_EQ(offsetof(EventDescrV4, proxy_step.step), 24u);
  EXPECT_EQ(offsetof(EventDescrV4, kernel_ch.channel_id), 24u);
  EXPECT_EQ(offsetof(EventDescrV4, kernel_ch.gpu_start_ns), 32u);

  EXPECT_EQ(sizeof(StateArgs), 8u);
  for (size_t size : {sizeof(ProfilerV5), sizeof(ProfilerV4)}) EXPECT_EQ(size, 48u);
  EXPECT_EQ(offsetof(ProfilerV5, name), 0u);
  EXPECT_EQ(offsetof(ProfilerV5, init), 8u);
  EXPECT_EQ(offsetof(ProfilerV5, start_event), 16u);
  EXPECT_EQ(offsetof(ProfilerV5, stop_event), 24u);
  EXPECT_EQ(offsetof(ProfilerV5, record_event_state), 32u);
  EXPECT_EQ(offsetof(ProfilerV5, finalize), 40u);
  // ncclProfilerEventState_t's numbers rankscope reads, and the event types' bits.
  EXPECT_EQ(kKernelChStop, 22);
  EXPECT_EQ(kProxyStepSendGpuWait, 8);
  EXPECT_EQ(kProxyStepRecvGpuWait, 12);
  EXPECT_EQ(kColl, 2u);
  EXPECT_EQ(kKernelCh, 64u);
}

// The built plugin, loaded the way NCCL loads it, with this process as the
// agent reading its ring.
class ProfilerPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    lib = dlopen(RANKSCOPE_PROFILER_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib, nullptr) << dlerror();
    // NCCL 2.28 looks for v5, then v4, ...
    v5 = static_cast<ProfilerV5*>(dlsym(lib, "ncclProfiler_v5"));
    v4 = static_cast<ProfilerV4*>(dlsym(lib, "ncclProfiler_v4"));
    ASSERT_NE(v5, nullptr);
    ASSERT_NE(v4, nullptr);
    EXPECT_EQ(dlsym(lib, "ncclProfiler_v6"), nullptr) << "v6 is not exported: NCCL 2.29+ adapt v5";
  }
  void TearDown() override {
    for (void* context : contexts) v5->finalize(context);
    // Nobody reads it now: the plugin removes the ring when this process
    // exits (a test that fails before attaching leaves none either).
    if (ring.header) {
      ring.header->reader.store(0);
      ring.header->detail.store(0);
      unmap_ring(ring);
    }
  }
  void* init_v5(uint64_t hash, int rank, int* mask) {
    void* context = nullptr;
    EXPECT_EQ(v5->init(&context, hash, mask, "test", 1, 4, rank, nullptr), kSuccess);
    contexts.push_back(context);
    return context;
  }
  // The ring the plugin made at its first init, mapped as the agent maps it.
  void attach() {
    std::string why;
    auto mapped = map_process_ring("/proc", static_cast<uint32_t>(getpid()), own_start_time(), why);
    ASSERT_TRUE(mapped) << "no ring: " << why;
    ring = *mapped;
    ASSERT_EQ(ring.header->magic, kRingMagic);
    ASSERT_EQ(ring.header->version, kRingVersion);
    ASSERT_EQ(ring.header->record_size, sizeof(Record));
    EXPECT_EQ(ring.header->pid, static_cast<uint32_t>(getpid()));
    ring.header->reader.store(static_cast<uint32_t>(getpid()));
    drain();  // what earlier tests in this process left
  }
  std::vector<RecordKind> drain(std::deque<Record>* out = nullptr) {
    std::vector<RecordKind> kinds;
    Record r;
    while (ring_read(ring, r)) {
      kinds.push_back(r.kind);
      if (out) {
        out->emplace_back();
        Record& o = out->back();
        o.comm_hash = r.comm_hash, o.seq_number = r.seq_number, o.host_ns = r.host_ns, o.gpu_ns = r.gpu_ns;
        o.bytes = r.bytes, o.rank = r.rank, o.peer = r.peer, o.event = r.event, o.kind = r.kind, o.op = r.op;
        o.channel = r.channel, o.state = r.state;
      }
    }
    return kinds;
  }

  void* lib = nullptr;
  ProfilerV5* v5 = nullptr;
  ProfilerV4* v4 = nullptr;
  std::vector<void*> contexts;
  RingView ring;
};

EventDescrV5 coll(uint64_t seq, const char* func, size_t count) {
  EventDescrV5 d{};
  d.type = kColl;
  d.rank = 2;
  d.coll.d.seq_number = seq;
  d.coll.d.func = func;
  d.coll.d.count = count;
  d.coll.d.root = -1;
  d.coll.d.datatype = "ncclFloat32";
  d.coll.d.n_channels = 2;
  return d;
}

TEST_F(ProfilerPlugin, ACollectiveAndItsKernelChannelsReachTheRingWithGpuTimes) {
  int mask = 0;
  void* context = init_v5(0xc0ffee, 2, &mask);
  EXPECT_EQ(mask, static_cast<int>(kColl | kP2p | kKernelCh)) << "only what rankscope reads";
  attach();

  EventDescrV5 c = coll(88121, "AllReduce", 1024);
  void* coll_handle = nullptr;
  ASSERT_EQ(v5->start_event(context, &coll_handle, &c), kSuccess);
  ASSERT_NE(coll_handle, nullptr);
  EventDescrV5 k{};
  k.type = kKernelCh;
  k.parent = coll_handle;
  k.rank = 2;
  k.kernel_ch.channel_id = 1;
  k.kernel_ch.gpu_start_ns = 5'000;
  void* kernel_handle = nullptr;
  ASSERT_EQ(v5->start_event(context, &kernel_handle, &k), kSuccess);
  ASSERT_EQ(v5->stop_event(coll_handle), kSuccess);  // enqueued: before the kernel ends
  StateArgs stop{};
  stop.kernel_ch.gpu_stop_ns = 905'000;
  ASSERT_EQ(v5->record_event_state(kernel_handle, kKernelChStop, &stop), kSuccess);
  ASSERT_EQ(v5->stop_event(kernel_handle), kSuccess);

  std::deque<Record> got;
  EXPECT_EQ(drain(&got), (std::vector<RecordKind>{RecordKind::coll_start, RecordKind::kernel_start,
                                                  RecordKind::coll_stop, RecordKind::kernel_stop}));
  ASSERT_EQ(got.size(), 4u);
  for (const Record& r : got) {
    EXPECT_EQ(r.comm_hash, 0xc0ffeeu);
    EXPECT_EQ(r.seq_number, 88121u);
    EXPECT_EQ(r.rank, 2);
    EXPECT_EQ(r.op, RS_OP_ALLREDUCE);
    EXPECT_GT(r.host_ns, 0u);
  }
  EXPECT_EQ(got[0].bytes, 1024u);
  EXPECT_EQ(got[0].state, 0) << "scheduled without proxy events";
  EXPECT_EQ(got[1].gpu_ns, 5'000u);
  EXPECT_EQ(got[1].channel, 1);
  EXPECT_EQ(got[1].event, got[0].event) << "the kernel names its collective";
  EXPECT_EQ(got[3].gpu_ns, 905'000u);
  EXPECT_LE(got[0].host_ns, got[3].host_ns);
}

TEST_F(ProfilerPlugin, TheV4TableTakesItsOwnArgumentOrderAndDescriptor) {
  int mask = 0;
  void* context = nullptr;
  ASSERT_EQ(v4->init(&context, &mask, "test", 0xbeef, 1, 2, 1, nullptr), kSuccess);
  attach();
  EventDescrV4 d{};
  d.type = kP2p;
  d.rank = 1;
  d.p2p.func = "Send";
  d.p2p.count = 64;
  d.p2p.peer = 0;
  void* handle = nullptr;
  ASSERT_EQ(v4->start_event(context, &handle, &d), kSuccess);
  ASSERT_EQ(v4->stop_event(handle), kSuccess);
  std::deque<Record> got;
  EXPECT_EQ(drain(&got), (std::vector<RecordKind>{RecordKind::p2p_start, RecordKind::p2p_stop}));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].comm_hash, 0xbeefu);
  EXPECT_EQ(got[0].op, RS_OP_SEND);
  EXPECT_EQ(got[0].peer, 0);
  EXPECT_EQ(got[0].bytes, 64u);
  EXPECT_EQ(v4->finalize(context), kSuccess);
}

TEST_F(ProfilerPlugin, WithNoReaderEveryEventIsOnlyCountedAndProxyDetailComesOnDemand) {
  int mask = 0;
  void* context = init_v5(0x5eed, 0, &mask);
  attach();
  ring.header->reader.store(0);  // no agent
  uint64_t dropped = ring.header->dropped.load();
  EventDescrV5 c = coll(1, "AllGather", 8);
  void* handle = nullptr;
  ASSERT_EQ(v5->start_event(context, &handle, &c), kSuccess);
  EXPECT_EQ(handle, nullptr) << "no handle: NCCL makes no further call for the event";
  ASSERT_EQ(v5->stop_event(handle), kSuccess);
  EXPECT_EQ(ring.header->dropped.load(), dropped + 1);
  EXPECT_TRUE(drain().empty());

  // The agent asks for proxy events: the next operation turns them on in
  // NCCL's mask (which NCCL reads at each operation), and off again.
  ring.header->reader.store(static_cast<uint32_t>(getpid()));
  ring.header->detail.store(1);
  ASSERT_EQ(v5->start_event(context, &handle, &c), kSuccess);
  EXPECT_EQ(mask & static_cast<int>(kProxyOp | kProxyStep), static_cast<int>(kProxyOp | kProxyStep));
  ring.header->detail.store(0);
  ASSERT_EQ(v5->start_event(context, &handle, &c), kSuccess);
  EXPECT_EQ(mask & static_cast<int>(kProxyOp | kProxyStep), 0);
}

// NCCL's PXN: a proxy operation this process's proxy runs for another local
// process names that process (pid), and comes with that process's context
// and parent: addresses in its memory. The plugin reads neither (here
// pointers that would crash it) and records nothing of it: its collective
// is not known here. This process's own operations are recorded as ever.
TEST_F(ProfilerPlugin, AProxyOperationOfAnotherProcessNeverReadsItsContextOrParent) {
  int mask = 0;
  void* context = init_v5(0xfeed, 1, &mask);
  attach();
  ring.header->detail.store(1);
  EventDescrV5 before = coll(6, "AllReduce", 64);
  void* before_handle = nullptr;
  ASSERT_EQ(v5->start_event(context, &before_handle, &before), kSuccess);  // turns proxy events on
  ASSERT_EQ(v5->stop_event(before_handle), kSuccess);
  EventDescrV5 c = coll(7, "AllReduce", 64);
  void* coll_handle = nullptr;
  ASSERT_EQ(v5->start_event(context, &coll_handle, &c), kSuccess);  // scheduled with them
  EventDescrV5 op{};
  op.type = kProxyOp;
  op.parent = reinterpret_cast<void*>(uintptr_t{0x10});  // another process's event
  op.rank = 1;
  op.proxy_op.pid = getpid() + 1;
  op.proxy_op.peer = 3;
  op.proxy_op.n_steps = 2;
  op.proxy_op.chunk_size = 512;
  op.proxy_op.is_send = 1;
  void* const other_context = reinterpret_cast<void*>(uintptr_t{0x20});  // another process's communicator
  void* op_handle = reinterpret_cast<void*>(uintptr_t{1});
  ASSERT_EQ(v5->start_event(other_context, &op_handle, &op), kSuccess);
  EXPECT_EQ(op_handle, nullptr) << "no handle: NCCL makes no further call for it, nor starts its steps";
  EventDescrV5 step{};
  step.type = kProxyStep;  // as NCCL would start one with the operation's (null) handle
  step.parent = op_handle;
  void* step_handle = reinterpret_cast<void*>(uintptr_t{1});
  ASSERT_EQ(v5->start_event(other_context, &step_handle, &step), kSuccess);
  EXPECT_EQ(step_handle, nullptr);

  // This process's own operation of the same collective is recorded.
  op.parent = coll_handle;
  op.proxy_op.pid = getpid();
  ASSERT_EQ(v5->start_event(context, &op_handle, &op), kSuccess);
  ASSERT_NE(op_handle, nullptr);
  step.parent = op_handle;
  // A proxy step's communicator is its operation's, whatever context comes with it.
  ASSERT_EQ(v5->start_event(other_context, &step_handle, &step), kSuccess);
  ASSERT_NE(step_handle, nullptr);
  ASSERT_EQ(v5->stop_event(step_handle), kSuccess);
  ASSERT_EQ(v5->stop_event(op_handle), kSuccess);
  ASSERT_EQ(v5->stop_event(coll_handle), kSuccess);
  std::deque<Record> got;
  drain(&got);
  size_t proxy = 0;
  for (const Record& r : got) {
    if (r.kind != RecordKind::proxy_op_start && r.kind != RecordKind::proxy_step) continue;
    ++proxy;
    EXPECT_EQ(r.comm_hash, 0xfeedu);
    EXPECT_EQ(r.op, RS_OP_ALLREDUCE);
    EXPECT_EQ(r.seq_number, 7u);
    EXPECT_EQ(r.peer, 3);
  }
  EXPECT_EQ(proxy, 2u) << "this process's operation and its step, nothing of the other process's";
  ring.header->detail.store(0);
}

// NCCL fixes, when it schedules a collective, whether its proxy work is
// reported. The plugin labels each collective with what NCCL's mask held
// (a change holds from the next one), and records all the proxy events of
// one scheduled while the agent asked for detail, even after the agent
// stops asking. (Those NCCL reports only for a chained plugin are not
// recorded: ...HearsTheParentsOfWhatItAskedFor.)
TEST_F(ProfilerPlugin, ProxyEventsAreRecordedToTheEndOfTheCollectivesScheduledWithThem) {
  int mask = 0;
  void* context = init_v5(0xde7a, 0, &mask);
  attach();
  auto proxy_records = [&](void* coll_handle) {
    EventDescrV5 op{};
    op.type = kProxyOp;
    op.parent = coll_handle;
    op.proxy_op.pid = getpid();
    op.proxy_op.peer = 1;
    op.proxy_op.is_send = 1;
    void* op_handle = nullptr;
    EXPECT_EQ(v5->start_event(context, &op_handle, &op), kSuccess);
    EventDescrV5 step{};
    step.type = kProxyStep;
    step.parent = op_handle;
    void* step_handle = nullptr;
    EXPECT_EQ(v5->start_event(context, &step_handle, &step), kSuccess);
    EXPECT_EQ(v5->stop_event(step_handle), kSuccess);
    EXPECT_EQ(v5->stop_event(op_handle), kSuccess);
    size_t n = 0;
    for (RecordKind k : drain())
      n += k == RecordKind::proxy_op_start || k == RecordKind::proxy_step || k == RecordKind::proxy_step_stop ||
           k == RecordKind::proxy_op_stop;
    return n;
  };
  // NCCL reads its mask when the job calls it, before the plugin hears of
  // the collective: a change the plugin makes at one collective holds
  // from the next on.
  auto collective = [&](uint64_t seq) {
    EventDescrV5 c = coll(seq, "AllReduce", 64);
    void* h = nullptr;
    EXPECT_EQ(v5->start_event(context, &h, &c), kSuccess);
    return h;
  };
  ring.header->detail.store(0);
  ASSERT_EQ(v5->stop_event(collective(0)), kSuccess);  // proxy events off (an earlier test may have left them on)
  drain();
  ring.header->detail.store(1);
  void* asking = collective(1);  // scheduled before the plugin turned them on
  EXPECT_EQ(mask & static_cast<int>(kProxyOp | kProxyStep), static_cast<int>(kProxyOp | kProxyStep));
  void* scheduled_with = collective(2);
  ring.header->detail.store(0);
  void* last_with = collective(3);  // scheduled with them: turns them off for the next
  EXPECT_EQ(mask & static_cast<int>(kProxyOp), 0) << "detail is off for what NCCL schedules next";
  void* scheduled_without = collective(4);
  std::deque<Record> starts;
  drain(&starts);
  ASSERT_EQ(starts.size(), 4u);
  EXPECT_EQ(starts[0].state, 0);
  EXPECT_EQ(starts[1].state, kCollDetail) << "its record says NCCL reports its proxy work";
  EXPECT_EQ(starts[2].state, kCollDetail);
  EXPECT_EQ(starts[3].state, 0);
  for (void* h : {asking, last_with}) ASSERT_EQ(v5->stop_event(h), kSuccess);
  drain();
  EXPECT_EQ(proxy_records(scheduled_with), 4u) << "its operation and step, started and stopped";
  ASSERT_EQ(v5->stop_event(scheduled_with), kSuccess);
  ASSERT_EQ(v5->stop_event(scheduled_without), kSuccess);
}

// An event NCCL still holds (started, not stopped) keeps its slot however
// many events come and go meanwhile: its stop is recorded as its own.
// When NCCL holds every slot a new event is dropped and counted.
TEST_F(ProfilerPlugin, AnEventNcclStillHoldsKeepsItsSlot) {
  int mask = 0;
  void* context = init_v5(0x51075, 0, &mask);
  attach();
  EventDescrV5 held = coll(42, "Broadcast", 8);
  void* held_handle = nullptr;
  ASSERT_EQ(v5->start_event(context, &held_handle, &held), kSuccess);
  for (uint64_t seq = 100; seq < 100 + 3 * 8192; ++seq) {
    EventDescrV5 c = coll(seq, "AllReduce", 8);
    void* h = nullptr;
    ASSERT_EQ(v5->start_event(context, &h, &c), kSuccess);
    ASSERT_NE(h, nullptr);
    ASSERT_NE(h, held_handle);
    ASSERT_EQ(v5->stop_event(h), kSuccess);
    if (seq % 1024 == 0) drain();  // as the agent drains: the ring itself never fills
  }
  drain();
  ASSERT_EQ(v5->stop_event(held_handle), kSuccess);
  std::deque<Record> got;
  drain(&got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, RecordKind::coll_stop);
  EXPECT_EQ(got[0].seq_number, 42u);
  EXPECT_EQ(got[0].op, RS_OP_BROADCAST);

  std::vector<void*> all;
  for (uint64_t seq = 0;; ++seq) {
    EventDescrV5 c = coll(seq, "AllReduce", 8);
    void* h = nullptr;
    ASSERT_EQ(v5->start_event(context, &h, &c), kSuccess);
    if (!h) break;
    all.push_back(h);
    if (seq % 1024 == 0) drain();
  }
  EXPECT_EQ(all.size(), 8192u) << "every slot, then none";
  drain();
  const uint64_t dropped = ring.header->dropped.load();
  EventDescrV5 c = coll(1, "AllReduce", 8);
  void* h = nullptr;
  ASSERT_EQ(v5->start_event(context, &h, &c), kSuccess);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(ring.header->dropped.load(), dropped + 1);
  for (void* each : all) v5->stop_event(each);
  drain();
}

// NCCL passes a collective as its kernels' parent after stopping it (once
// enqueued). If its slot has since gone round to an event of another type,
// that event is not read as the kernel's collective: the kernel is
// recorded without one.
TEST_F(ProfilerPlugin, AParentWhoseSlotNowHoldsAnotherKindOfEventIsNone) {
  int mask = 0;
  void* context = init_v5(0x57a1e, 0, &mask);
  attach();
  EventDescrV5 b = coll(99, "AllGather", 8);
  void* held = nullptr;
  ASSERT_EQ(v5->start_event(context, &held, &b), kSuccess);
  EventDescrV5 a = coll(5, "AllReduce", 8);
  void* enqueued = nullptr;
  ASSERT_EQ(v5->start_event(context, &enqueued, &a), kSuccess);
  ASSERT_EQ(v5->stop_event(enqueued), kSuccess);  // enqueued: its kernels start later
  // Kernels of collective 99 go by until one takes collective 5's slot.
  EventDescrV5 k{};
  k.type = kKernelCh;
  k.parent = held;
  void* in_its_slot = nullptr;
  for (int i = 0; i < 3 * 8192 && !in_its_slot; ++i) {
    void* h = nullptr;
    ASSERT_EQ(v5->start_event(context, &h, &k), kSuccess);
    if (h == enqueued)
      in_its_slot = h;
    else
      ASSERT_EQ(v5->stop_event(h), kSuccess);
    if (i % 1024 == 0) drain();
  }
  ASSERT_NE(in_its_slot, nullptr);
  drain();
  EventDescrV5 late{};
  late.type = kKernelCh;
  late.parent = enqueued;  // collective 5's kernel, as NCCL reports it
  void* h = nullptr;
  ASSERT_EQ(v5->start_event(context, &h, &late), kSuccess);
  std::deque<Record> got;
  drain(&got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, RecordKind::kernel_start);
  EXPECT_EQ(got[0].seq_number, 0u) << "not collective 99's, whose kernel holds the slot";
  EXPECT_EQ(got[0].op, 0);
  for (void* each : {h, in_its_slot, held}) ASSERT_EQ(v5->stop_event(each), kSuccess);
  drain();
}

// NCCL reports its proxy thread's own state with the context of the
// communicator that made the proxy, which may be finalized: never read.
TEST_F(ProfilerPlugin, TheProxyThreadsOwnEventsAreNeverRead) {
  EventDescrV5 ctrl{};
  ctrl.type = kProxyCtrl;
  void* h = reinterpret_cast<void*>(uintptr_t{1});
  ASSERT_EQ(v5->start_event(reinterpret_cast<void*>(uintptr_t{0x30}), &h, &ctrl), kSuccess);
  EXPECT_EQ(h, nullptr);
}

// The chained stand-in's counts (tests/support/chained_profiler.cpp).
enum { inits, finalized, groups, colls, kernels, others, stops, kernel_stops, foreign, proxy_ops, proxy_steps, kCounts };

// NCCL loads one profiler plugin per process; RANKSCOPE_NCCL_PROFILER_CHAIN
// names another (here a stand-in for NVIDIA's Inspector), which rankscope's
// loads and passes NCCL's calls on to. NCCL's mask is the union of both;
// the other plugin hears exactly the events it asked for (groups, which
// rankscope does not record, too), with its own context, handles and
// parents, whether an agent reads rankscope's ring or not. rankscope's ring
// gets what it always did.
TEST_F(ProfilerPlugin, AnotherPluginNamedInTheEnvironmentHearsWhatItAskedForThroughRankscopes) {
  setenv("RANKSCOPE_NCCL_PROFILER_CHAIN", RANKSCOPE_TEST_CHAINED_PLUGIN, 1);
  int mask = 0;
  void* context = init_v5(0xc4a1, 1, &mask);
  unsetenv("RANKSCOPE_NCCL_PROFILER_CHAIN");
  void* other = dlopen(RANKSCOPE_TEST_CHAINED_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(other, nullptr) << "rankscope's plugin did not load the chained one";
  auto counts_of = reinterpret_cast<void (*)(int*)>(dlsym(other, "rankscope_test_chain_counts"));
  ASSERT_NE(counts_of, nullptr);
  int c[kCounts];
  counts_of(c);
  EXPECT_EQ(c[inits], 1);
  EXPECT_EQ(mask, static_cast<int>(kGroup | kColl | kP2p | kKernelCh)) << "what either asked for";
  attach();

  auto one_collective = [&](uint64_t seq) {
    EventDescrV5 g{};
    g.type = kGroup;
    g.rank = 1;
    void* group = nullptr;
    ASSERT_EQ(v5->start_event(context, &group, &g), kSuccess);
    ASSERT_NE(group, nullptr) << "a handle that carries the other plugin's";
    EventDescrV5 d = coll(seq, "AllReduce", 256);
    d.parent = group;
    void* collective = nullptr;
    ASSERT_EQ(v5->start_event(context, &collective, &d), kSuccess);
    EventDescrV5 k{};
    k.type = kKernelCh;
    k.parent = collective;
    k.kernel_ch.gpu_start_ns = 1'000;
    void* kernel = nullptr;
    ASSERT_EQ(v5->start_event(context, &kernel, &k), kSuccess);
    ASSERT_EQ(v5->stop_event(collective), kSuccess);
    StateArgs args{};
    args.kernel_ch.gpu_stop_ns = 2'000;
    ASSERT_EQ(v5->record_event_state(kernel, kKernelChStop, &args), kSuccess);
    ASSERT_EQ(v5->stop_event(kernel), kSuccess);
    ASSERT_EQ(v5->stop_event(group), kSuccess);
  };
  one_collective(1);
  EXPECT_EQ(drain(), (std::vector<RecordKind>{RecordKind::coll_start, RecordKind::kernel_start, RecordKind::coll_stop,
                                              RecordKind::kernel_stop}))
      << "rankscope's records as without a chained plugin: no group";
  ring.header->reader.store(0);  // no agent now: rankscope only counts, the other plugin still hears all
  one_collective(2);
  EXPECT_TRUE(drain().empty());
  ring.header->reader.store(static_cast<uint32_t>(getpid()));

  counts_of(c);
  EXPECT_EQ(c[groups], 2);
  EXPECT_EQ(c[colls], 2);
  EXPECT_EQ(c[kernels], 2);
  EXPECT_EQ(c[kernel_stops], 2);
  EXPECT_EQ(c[stops], 6);
  EXPECT_EQ(c[others], 0) << "only what it asked for";
  EXPECT_EQ(c[foreign], 0) << "every handle, parent and context its own; each kernel's parent its collective";
  ASSERT_EQ(v5->finalize(context), kSuccess);
  contexts.clear();
  counts_of(c);
  EXPECT_EQ(c[finalized], 1);
}

// NCCL's mask is one per process: the chained plugin's part of it is the
// same for every communicator, whichever init it came through, and it may
// change it later. NCCL starts an event for a plugin that asked only for
// its children (their parents): a plugin asking for proxy steps alone
// hears collectives and proxy operations too, each step with its
// operation as parent, and no kernel channel.
TEST_F(ProfilerPlugin, TheChainedPluginsMaskIsTheProcesssAndItHearsTheParentsOfWhatItAskedFor) {
  setenv("RANKSCOPE_NCCL_PROFILER_CHAIN", RANKSCOPE_TEST_CHAINED_PLUGIN, 1);
  int nccl_mask = 0;  // NCCL passes the same int to every init
  void* first = init_v5(0xa11, 0, &nccl_mask);
  void* second = init_v5(0xa12, 0, &nccl_mask);
  unsetenv("RANKSCOPE_NCCL_PROFILER_CHAIN");
  void* other = dlopen(RANKSCOPE_TEST_CHAINED_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(other, nullptr);
  auto counts_of = reinterpret_cast<void (*)(int*)>(dlsym(other, "rankscope_test_chain_counts"));
  auto set_mask = reinterpret_cast<void (*)(int)>(dlsym(other, "rankscope_test_chain_set_mask"));
  ASSERT_NE(counts_of, nullptr);
  ASSERT_NE(set_mask, nullptr);
  attach();
  set_mask(static_cast<int>(kProxyStep));
  int before[kCounts], after[kCounts];
  counts_of(before);

  EventDescrV5 c = coll(5, "AllReduce", 64);
  void* coll_handle = nullptr;
  ASSERT_EQ(v5->start_event(second, &coll_handle, &c), kSuccess);
  EXPECT_EQ(nccl_mask, static_cast<int>(kColl | kP2p | kKernelCh | kProxyStep))
      << "the chained plugin's new mask, read at the next operation of any communicator";
  EventDescrV5 k{};
  k.type = kKernelCh;
  k.parent = coll_handle;
  void* kernel = nullptr;
  ASSERT_EQ(v5->start_event(second, &kernel, &k), kSuccess);
  EventDescrV5 op{};
  op.type = kProxyOp;
  op.parent = coll_handle;
  op.proxy_op.pid = getpid();
  void* op_handle = nullptr;
  ASSERT_EQ(v5->start_event(second, &op_handle, &op), kSuccess);
  ASSERT_NE(op_handle, nullptr) << "a carrier of the chained plugin's operation";
  EventDescrV5 step{};
  step.type = kProxyStep;
  step.parent = op_handle;
  void* step_handle = nullptr;
  ASSERT_EQ(v5->start_event(second, &step_handle, &step), kSuccess);
  ASSERT_NE(step_handle, nullptr);
  for (void* h : {step_handle, op_handle, coll_handle, kernel}) ASSERT_EQ(v5->stop_event(h), kSuccess);
  counts_of(after);
  EXPECT_EQ(after[colls] - before[colls], 1) << "the parent of what it asked for";
  EXPECT_EQ(after[proxy_ops] - before[proxy_ops], 1);
  EXPECT_EQ(after[proxy_steps] - before[proxy_steps], 1);
  EXPECT_EQ(after[kernels] - before[kernels], 0) << "not asked for, and no parent of what was";
  EXPECT_EQ(after[foreign] - before[foreign], 0) << "each parent its own, of the right type";
  EXPECT_EQ(drain(), (std::vector<RecordKind>{RecordKind::coll_start, RecordKind::kernel_start,
                                              RecordKind::coll_stop}))
      << "rankscope records no proxy event it was not asked for (the kernel's stop is its state)";

  set_mask(static_cast<int>(kGroup | kColl | kKernelCh));
  EventDescrV5 next = coll(6, "AllReduce", 64);
  void* h = nullptr;
  ASSERT_EQ(v5->start_event(first, &h, &next), kSuccess);
  EXPECT_EQ(nccl_mask, static_cast<int>(kGroup | kColl | kP2p | kKernelCh));
  ASSERT_EQ(v5->stop_event(h), kSuccess);
  drain();
}

TEST(ProfilerRing, AFullRingDropsAndCountsAndKeepsOrder) {
  constexpr uint32_t kSlots = 8;
  std::vector<char> memory(ring_bytes(kSlots) + 64);
  void* aligned = memory.data() + (64 - reinterpret_cast<uintptr_t>(memory.data()) % 64) % 64;
  RingView ring{static_cast<RingHeader*>(aligned),
                reinterpret_cast<Record*>(static_cast<char*>(aligned) + sizeof(RingHeader))};
  std::fill(static_cast<char*>(aligned), static_cast<char*>(aligned) + ring_bytes(kSlots), 0);
  ring_init(ring, kSlots, 1, 0);
  ring.header->reader.store(1);
  Record r{};
  for (uint64_t i = 0; i < kSlots + 3; ++i) {
    r.seq_number = i;
    EXPECT_EQ(ring_write(ring, r), i < kSlots) << i;
  }
  EXPECT_EQ(ring.header->dropped.load(), 3u);
  Record out;
  for (uint64_t i = 0; i < kSlots; ++i) {
    ASSERT_TRUE(ring_read(ring, out));
    EXPECT_EQ(out.seq_number, i);
  }
  EXPECT_FALSE(ring_read(ring, out));
  r.seq_number = 100;
  EXPECT_TRUE(ring_write(ring, r)) << "room again once read";
  ASSERT_TRUE(ring_read(ring, out));
  EXPECT_EQ(out.seq_number, 100u);
}

}  // namespace
}  // namespace rankscope::profiler
