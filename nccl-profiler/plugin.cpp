// librankscope-nccl-profiler.so: NCCL's profiler plugin (abi.h), writing each
// event NCCL reports into the process's shared-memory ring (ring.h) for the
// node agent. Loaded by NCCL when NCCL_PROFILER_PLUGIN names it; docs/gpu-timing.md.
//
// NCCL's hot path (startEvent, stopEvent, recordEventState) takes an event
// slot from a fixed per-communicator pool, reads the monotonic clock (vDSO)
// and writes one record: no allocation, no lock, no system call. init and
// finalize, once per communicator, may do all three.
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include "nccl-profiler/abi.h"
#include "nccl-profiler/ring.h"
#include "proto/records.h"

namespace rankscope::profiler {
namespace {

constexpr uint32_t kEventsPerComm = 1u << 13;  // live events a communicator may hold (recycled in turn)
// Proxy steps come by the thousand in a large collective and live briefly:
// a pool of their own, so that they never recycle a collective's, a
// kernel's or a proxy operation's event while it lives. Their ids have the
// high bit set.
constexpr uint32_t kStepsPerComm = 1u << 13;
constexpr uint32_t kStepIdBit = 1u << 31;

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The process's ring, made at the first init; none if it could not be made
// (then every record is counted as dropped, here only).
struct Process {
  std::once_flag made;
  pid_t pid = 0;  // this process (a proxy operation of another one has a parent in its memory, not ours)
  RingView ring;
  std::atomic<uint64_t> unrecorded{0};
  std::atomic<int> comms{0};

  void make() {
    pid = getpid();
    int fd = memfd_create(kRingMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return;
    const size_t bytes = ring_bytes(kRingSlots);
    void* map = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 && fcntl(fd, F_ADD_SEALS, kRingSeals) == 0)
      map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      return;
    }
    // The descriptor stays open: the agent finds the ring through it
    // (/proc/PID/fd). The ring goes with the process, or with the agent's
    // mapping of it once both are gone: nothing is left behind.
    ring.header = static_cast<RingHeader*>(map);
    ring.records = reinterpret_cast<Record*>(static_cast<char*>(map) + sizeof(RingHeader));
    ring_init(ring, kRingSlots, static_cast<uint32_t>(getpid()), own_start_time());
  }
  void write(const Record& record) {
    if (!ring.header) {
      unrecorded.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    ring_write(ring, record);
  }
  bool detail() const { return ring.header && ring.header->detail.load(std::memory_order_relaxed) != 0; }
  // Someone drains the ring; else an event is only counted (no handle, so
  // NCCL makes no further call for it).
  bool read() {
    if (ring.header && ring.header->reader.load(std::memory_order_relaxed) != 0) return true;
    if (ring.header)
      ring.header->dropped.fetch_add(1, std::memory_order_relaxed);
    else
      unrecorded.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
} process;

struct Comm;

struct Event {
  Comm* comm = nullptr;
  uint32_t id = 0;
  RecordKind stop_kind = RecordKind::coll_stop;  // what stopEvent writes (none for kernels: their state does)
  bool stop_writes = true;
  uint8_t op = 0;
  uint8_t channel = 0;
  uint8_t direction = 0;  // proxy events: kProxySend or 0
  int32_t peer = -1;
  uint64_t seq_number = 0;
};

struct Comm {
  uint64_t hash = 0;
  int32_t rank = -1;
  int* mask = nullptr;  // NCCL's activation mask, read again at each operation
  bool detail = false;
  std::atomic<uint32_t> next{0};
  std::atomic<uint32_t> next_step{0};
  std::unique_ptr<Event[]> events = std::make_unique<Event[]>(kEventsPerComm);
  std::unique_ptr<Event[]> steps = std::make_unique<Event[]>(kStepsPerComm);

  Event* take() {
    uint32_t id = next.fetch_add(1, std::memory_order_relaxed) & ~kStepIdBit;
    Event* e = &events[id & (kEventsPerComm - 1)];
    e->comm = this;
    e->id = id;
    e->direction = 0;
    return e;
  }
  Event* take_step() {
    uint32_t id = next_step.fetch_add(1, std::memory_order_relaxed) | kStepIdBit;
    Event* e = &steps[id & (kStepsPerComm - 1)];
    e->comm = this;
    e->id = id;
    e->direction = 0;
    return e;
  }
  // Proxy events on while the agent asks for them (detail on demand).
  void follow_detail() {
    bool wanted = process.detail();
    if (wanted == detail || !mask) return;
    detail = wanted;
    int proxy = static_cast<int>(abi::kProxyOp | abi::kProxyStep);
    *mask = wanted ? (*mask | proxy) : (*mask & ~proxy);
  }
};

constexpr int kBaseMask = static_cast<int>(abi::kColl | abi::kP2p | abi::kKernelCh);

void fill(Record& r, const Event& e, RecordKind kind) {
  r.comm_hash = e.comm->hash;
  r.seq_number = e.seq_number;
  r.host_ns = monotonic_ns();
  r.gpu_ns = 0;
  r.bytes = 0;
  r.rank = e.comm->rank;
  r.peer = e.peer;
  r.event = e.id;
  r.kind = kind;
  r.op = e.op;
  r.channel = e.channel;
  r.state = e.direction;
}

abi::Result init(void** context, uint64_t comm_hash, int* mask, int rank) {
  std::call_once(process.made, [] { process.make(); });
  auto* comm = new Comm;
  comm->hash = comm_hash;
  comm->rank = rank;
  comm->mask = mask;
  if (mask) *mask = kBaseMask;
  comm->follow_detail();
  process.comms.fetch_add(1);
  *context = comm;
  return abi::kSuccess;
}

// The descriptor's fields, whichever version's they are.
struct Descr {
  uint64_t type;
  void* parent;
  const abi::CollDescr* coll;
  const abi::P2pDescr* p2p;
  const abi::ProxyOpDescr* proxy_op;
  int step;
  const abi::KernelChDescr* kernel_ch;
};

abi::Result start(void* context, void** handle, const Descr& d) {
  *handle = nullptr;
  auto* comm = static_cast<Comm*>(context);
  if (d.type == abi::kColl) comm->follow_detail();
  if (!process.read()) return abi::kSuccess;
  auto* parent = static_cast<Event*>(d.parent);
  Event* e = nullptr;
  Record r;
  switch (d.type) {
    case abi::kColl: {
      e = comm->take();
      e->op = proto::op_from_name(d.coll->func ? d.coll->func : "");
      e->seq_number = d.coll->seq_number;
      e->peer = d.coll->root;
      e->channel = d.coll->n_channels;
      e->stop_kind = RecordKind::coll_stop;
      e->stop_writes = true;
      fill(r, *e, RecordKind::coll_start);
      r.bytes = d.coll->count;
      break;
    }
    case abi::kP2p: {
      e = comm->take();
      e->op = proto::op_from_name(d.p2p->func ? d.p2p->func : "");
      e->seq_number = 0;
      e->peer = d.p2p->peer;
      e->channel = d.p2p->n_channels;
      e->stop_kind = RecordKind::p2p_stop;
      e->stop_writes = true;
      fill(r, *e, RecordKind::p2p_start);
      r.bytes = d.p2p->count;
      break;
    }
    case abi::kKernelCh: {
      // A channel of the collective or p2p operation `parent`.
      e = comm->take();
      e->op = parent ? parent->op : 0;
      e->seq_number = parent ? parent->seq_number : 0;
      e->peer = parent ? parent->peer : -1;
      e->channel = d.kernel_ch->channel_id;
      e->stop_writes = false;  // its stop is the KernelChStop state, with the GPU time
      fill(r, *e, RecordKind::kernel_start);
      r.gpu_ns = d.kernel_ch->gpu_start_ns;
      if (parent) r.event = parent->id;
      break;
    }
    case abi::kProxyOp: {
      // NCCL's PXN: this process's proxy moves another local process's data,
      // and the parent is that process's event, an address in its memory:
      // never read. The operation is recorded without its collective.
      if (d.proxy_op->pid != process.pid) parent = nullptr;
      e = comm->take();
      e->op = parent ? parent->op : 0;
      e->seq_number = parent ? parent->seq_number : 0;
      e->peer = d.proxy_op->peer;
      e->channel = d.proxy_op->channel_id;
      e->direction = d.proxy_op->is_send ? kProxySend : 0;
      e->stop_kind = RecordKind::proxy_op_stop;
      e->stop_writes = true;
      fill(r, *e, RecordKind::proxy_op_start);
      r.bytes = static_cast<uint64_t>(d.proxy_op->n_steps) * static_cast<uint64_t>(d.proxy_op->chunk_size);
      break;
    }
    case abi::kProxyStep: {
      if (!parent) return abi::kSuccess;
      e = comm->take_step();
      e->op = parent->op;
      e->seq_number = parent->seq_number;
      e->peer = parent->peer;
      e->channel = parent->channel;
      e->direction = parent->direction;
      e->stop_kind = RecordKind::proxy_step_stop;
      e->stop_writes = true;
      fill(r, *e, RecordKind::proxy_step);
      r.bytes = static_cast<uint64_t>(d.step);
      break;
    }
    default:
      return abi::kSuccess;  // not enabled by rankscope
  }
  process.write(r);
  *handle = e;
  return abi::kSuccess;
}

abi::Result stop(void* handle) {
  auto* e = static_cast<Event*>(handle);
  if (!e || !e->stop_writes) return abi::kSuccess;
  Record r;
  fill(r, *e, e->stop_kind);
  process.write(r);
  return abi::kSuccess;
}

abi::Result record_state(void* handle, int state, abi::StateArgs* args) {
  auto* e = static_cast<Event*>(handle);
  if (!e) return abi::kSuccess;
  if (state == abi::kKernelChStop) {
    Record r;
    fill(r, *e, RecordKind::kernel_stop);
    r.gpu_ns = args ? args->kernel_ch.gpu_stop_ns : 0;
    process.write(r);
  } else if (state >= abi::kProxyStepSendGpuWait && state <= abi::kProxyStepRecvGpuWait) {
    Record r;
    fill(r, *e, RecordKind::proxy_step);
    r.state = static_cast<uint8_t>(e->direction | (state & kProxyStateMask));
    r.bytes = args ? args->proxy_step.trans_size : 0;
    process.write(r);
  }
  return abi::kSuccess;
}

abi::Result finalize(void* context) {
  delete static_cast<Comm*>(context);
  process.comms.fetch_sub(1);
  return abi::kSuccess;
}

abi::Result init_v5(void** context, uint64_t comm_hash, int* mask, const char*, int, int, int rank, abi::Logger) {
  return init(context, comm_hash, mask, rank);
}
abi::Result init_v4(void** context, int* mask, const char*, uint64_t comm_hash, int, int, int rank, abi::Logger) {
  return init(context, comm_hash, mask, rank);
}

abi::Result start_v5(void* context, void** handle, abi::EventDescrV5* d) {
  return start(context, handle,
               Descr{d->type, d->parent, &d->coll.d, &d->p2p.d, &d->proxy_op, d->proxy_step.step, &d->kernel_ch});
}
abi::Result start_v4(void* context, void** handle, abi::EventDescrV4* d) {
  return start(context, handle,
               Descr{d->type, d->parent, &d->coll, &d->p2p, &d->proxy_op, d->proxy_step.step, &d->kernel_ch});
}

}  // namespace
}  // namespace rankscope::profiler

namespace rp = rankscope::profiler;

extern "C" {
__attribute__((visibility("default"))) rp::abi::ProfilerV5 ncclProfiler_v5 = {
    "rankscope", rp::init_v5, rp::start_v5, rp::stop, rp::record_state, rp::finalize};
__attribute__((visibility("default"))) rp::abi::ProfilerV4 ncclProfiler_v4 = {
    "rankscope", rp::init_v4, rp::start_v4, rp::stop, rp::record_state, rp::finalize};
}
