// librankscope-nccl-profiler.so: NCCL's profiler plugin (abi.h), writing each
// event NCCL reports into the process's shared-memory ring (ring.h) for the
// node agent. Loaded by NCCL when NCCL_PROFILER_PLUGIN names it; docs/gpu-timing.md.
//
// NCCL's hot path (startEvent, stopEvent, recordEventState) takes an event
// slot from a fixed per-communicator pool, reads the monotonic clock (vDSO)
// and writes one record: no allocation, no lock, no system call. init and
// finalize, once per communicator, may do all three.
//
// NCCL's PXN has this process's proxy move the data of another process on
// the node: the proxy operation then comes with that process's context and
// parent, addresses in its memory. The plugin never reads either: it tells
// such an operation by its pid, and the communicator of a proxy step by its
// parent (its own operation), never by the context NCCL passes with it.
//
// NCCL loads one profiler plugin per process. RANKSCOPE_NCCL_PROFILER_CHAIN
// names another (NVIDIA's NCCL Inspector, say: a path, or a name NCCL's way,
// libnccl-profiler-NAME.so): this plugin loads it and passes every call on
// to it, with the events it asked for, as if NCCL called it directly (its
// own contexts, handles and parents; NCCL's mask is the union of both).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

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
  // Whether NCCL's mask (one per process) asks for proxy events on
  // rankscope's behalf now: what NCCL copies into the operations it
  // schedules until the plugin next changes it.
  std::atomic<bool> proxied{false};

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
  void drop() {
    if (ring.header)
      ring.header->dropped.fetch_add(1, std::memory_order_relaxed);
    else
      unrecorded.fetch_add(1, std::memory_order_relaxed);
  }
  bool detail() const { return ring.header && ring.header->detail.load(std::memory_order_relaxed) != 0; }
  // Someone drains the ring; else an event is only counted (no handle, so
  // NCCL makes no further call for it).
  bool read() {
    if (ring.header && ring.header->reader.load(std::memory_order_relaxed) != 0) return true;
    drop();
    return false;
  }
} process;

// The plugin RANKSCOPE_NCCL_PROFILER_CHAIN names, loaded at the first init
// that finds it set (later names are not read); its table of the version
// NCCL called this one with.
struct Chain {
  std::mutex mutex;
  // What the chained plugin asks for. NCCL's mask is one per process, so
  // this is too: every init of the chained plugin gets it, and may change it.
  int mask = 0;
  bool tried = false;
  std::string name;
  void* lib = nullptr;
  const abi::ProfilerV5* v5 = nullptr;
  const abi::ProfilerV4* v4 = nullptr;
  bool v5_tried = false, v4_tried = false;
} chain;

void say(abi::Logger log, int level, const std::string& text) {
  if (log)
    log(level, 1 /* NCCL_INIT */, __FILE__, __LINE__, "%s", text.c_str());
  else
    std::fprintf(stderr, "NCCL profiler: %s\n", text.c_str());
}

// The chained plugin's table of version 5 (or 4), or null (none named, or
// it cannot be used: said once, through NCCL's logger).
template <typename Table>
const Table* chained(abi::Logger log, const char* symbol, const Table* own) {
  const char* env = std::getenv("RANKSCOPE_NCCL_PROFILER_CHAIN");
  if (!env || !*env) return nullptr;
  std::lock_guard<std::mutex> lock(chain.mutex);
  if (!chain.tried) {
    chain.tried = true;
    chain.name = env;
    const std::string file = std::strchr(env, '/') ? chain.name : "libnccl-profiler-" + chain.name + ".so";
    chain.lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!chain.lib) say(log, 2 /* WARN */, "rankscope: not chaining to " + chain.name + ": " + dlerror());
  }
  if (!chain.lib) return nullptr;
  constexpr bool v5 = std::is_same_v<Table, abi::ProfilerV5>;
  const Table*& table = [&]() -> const Table*& {
    if constexpr (v5) return chain.v5;
    else return chain.v4;
  }();
  bool& tried = v5 ? chain.v5_tried : chain.v4_tried;
  if (table || tried) return table;
  tried = true;
  auto* found = static_cast<const Table*>(dlsym(chain.lib, symbol));
  if (found == own || (found && found->name && std::strcmp(found->name, own->name) == 0)) {
    say(log, 2, "rankscope: not chaining to " + chain.name + ": it is rankscope's own plugin");
  } else if (!found || !found->init || !found->start_event || !found->stop_event || !found->record_event_state ||
             !found->finalize) {
    say(log, 2, "rankscope: not chaining to " + chain.name + ": it has no complete " + symbol +
                    ", the version NCCL called rankscope's with");
  } else {
    table = found;
    say(log, 3 /* INFO */, "rankscope: chaining to " + chain.name + " (" + (found->name ? found->name : "?") +
                               ", " + symbol + ")");
  }
  return table;
}

struct Comm;

struct Event {
  std::atomic<bool> live{false};  // handed to NCCL and not yet stopped: never taken again meanwhile
  // Its NCCL type. NCCL may pass a stopped event as a parent (a collective
  // is stopped when enqueued, before its kernels and proxy work start), and
  // its slot may hold another event by then: a parent of a type NCCL never
  // gives that child is taken as none (same type: see docs/gpu-timing.md).
  std::atomic<uint64_t> type{0};
  Comm* comm = nullptr;
  uint32_t id = 0;
  void* chained = nullptr;  // the chained plugin's handle of the same event
  bool recorded = false;    // rankscope records it (else it only carries `chained`)
  // Collectives and p2p operations: proxy events were wanted when NCCL
  // scheduled it (NCCL fixes the mask of its proxy work then), so its proxy
  // operations and their steps are recorded, even if the agent stops asking
  // before they end.
  bool detail = false;
  RecordKind stop_kind = RecordKind::coll_stop;  // what stopEvent writes (none for kernels: their state does)
  bool stop_writes = true;
  uint8_t op = 0;
  uint8_t channel = 0;
  uint8_t direction = 0;  // proxy events: kProxySend or 0
  int32_t peer = -1;
  uint64_t seq_number = 0;
};

// Slots a take() looks at, from its turn on, for one not live; none free
// (NCCL holds that many events unstopped): the event is not recorded.
constexpr uint32_t kProbes = 8;

struct Comm {
  uint64_t hash = 0;
  int32_t rank = -1;
  int* mask = nullptr;  // NCCL's activation mask (one per process), read again at each operation
  // The chained plugin's session (null: none).
  void* chained = nullptr;
  const abi::ProfilerV5* chained_v5 = nullptr;
  const abi::ProfilerV4* chained_v4 = nullptr;
  std::atomic<uint32_t> next{0};
  std::atomic<uint32_t> next_step{0};
  // Sends and Recvs numbered from 1 (NCCL gives them no seqNumber), so that
  // the agent tells one's kernels from another's; [0] Sends, [1] Recvs.
  std::atomic<uint64_t> p2p_seq[2] = {0, 0};
  std::unique_ptr<Event[]> events = std::make_unique<Event[]>(kEventsPerComm);
  std::unique_ptr<Event[]> steps = std::make_unique<Event[]>(kStepsPerComm);

  // A free slot of the main pool (collectives, p2p, kernels, proxy
  // operations) or of the steps' (proxy steps and what lives beneath
  // them), marked live; null when none is free.
  Event* take() { return take_from(events.get(), kEventsPerComm, next, 0); }
  Event* take_step() { return take_from(steps.get(), kStepsPerComm, next_step, kStepIdBit); }
  // Proxy events on while the agent asks for them (detail on demand), and
  // whatever the chained plugin asks for now.
  void follow_detail();

 private:
  Event* take_from(Event* pool, uint32_t size, std::atomic<uint32_t>& turn, uint32_t id_bit) {
    for (uint32_t probe = 0; probe < kProbes; ++probe) {
      const uint32_t id = (turn.fetch_add(1, std::memory_order_relaxed) & ~kStepIdBit) | id_bit;
      Event* e = &pool[id & (size - 1)];
      // The turn counter gives concurrent takers different slots (the same
      // one only a whole pool apart), so no compare-and-swap is needed:
      // only a slot NCCL still holds is passed over.
      if (e->live.load(std::memory_order_acquire)) continue;
      e->live.store(true, std::memory_order_relaxed);
      e->type.store(0, std::memory_order_relaxed);  // its own once started
      e->comm = this;
      e->id = id;
      e->direction = 0;
      e->chained = nullptr;
      e->recorded = true;
      e->detail = false;
      return e;
    }
    return nullptr;
  }
};

constexpr int kBaseMask = static_cast<int>(abi::kColl | abi::kP2p | abi::kKernelCh);
constexpr int kProxyMask = static_cast<int>(abi::kProxyOp | abi::kProxyStep);

int chained_mask() { return __atomic_load_n(&chain.mask, __ATOMIC_RELAXED); }

void Comm::follow_detail() {
  const bool detail = process.detail();
  if (!mask) return;
  const int wanted = kBaseMask | (detail ? kProxyMask : 0) | chained_mask();
  if (__atomic_load_n(mask, __ATOMIC_RELAXED) != wanted) __atomic_store_n(mask, wanted, __ATOMIC_RELAXED);
  process.proxied.store(detail, std::memory_order_relaxed);
}

// The event NCCL handed back as a handle: one of this process's.
Event* event_of(void* handle) { return static_cast<Event*>(handle); }

// `parent`, or null when its slot holds an event of none of `types`.
Event* parent_with(uint64_t types, void* parent) {
  Event* p = event_of(parent);
  return p && (p->type.load(std::memory_order_relaxed) & types) ? p : nullptr;
}
// The parent NCCL gives an event of `type`, or null when its slot holds
// an event of a type NCCL never gives as that child's parent.
Event* parent_of(uint64_t type, void* parent) { return parent_with(abi::parent_types(type), parent); }

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

// The communicator of the event NCCL describes, or null when it is not
// this process's to read: a proxy operation of another process (PXN; its
// context is an address in that process), or an event beneath one that
// was not recorded. A proxy step (and a network plugin's event beneath it)
// takes its operation's: PXN hands it the other process's context too.
Comm* owner(void* context, const Descr& d) {
  switch (d.type) {
    case abi::kProxyOp: return d.proxy_op->pid == process.pid ? static_cast<Comm*>(context) : nullptr;
    case abi::kProxyStep:
    case abi::kNetPlugin: {
      Event* parent = parent_of(d.type, d.parent);
      return parent ? parent->comm : nullptr;
    }
    default: return static_cast<Comm*>(context);
  }
}

// The chained plugin's start of the event NCCL described with `d`, when
// NCCL would have started it for that plugin alone (copied: its parents,
// rankscope's handles, become the chained plugin's own).
template <typename Table, typename Descriptor>
void* chained_start(Comm* comm, const Table* table, const Descriptor& d) {
  if (!comm->chained || !(static_cast<uint64_t>(chained_mask()) & abi::started_for(d.type))) return nullptr;
  auto theirs = [](uint64_t parent_types, void* parent) {
    Event* p = parent_with(parent_types, parent);
    return p ? p->chained : nullptr;
  };
  Descriptor copy = d;
  copy.parent = theirs(abi::parent_types(d.type), d.parent);
  if constexpr (std::is_same_v<Descriptor, abi::EventDescrV5>) {
    if (d.type == abi::kColl) copy.coll.parent_group = theirs(abi::kGroup, d.coll.parent_group);
    if (d.type == abi::kP2p) copy.p2p.parent_group = theirs(abi::kGroup, d.p2p.parent_group);
  }
  void* out = nullptr;
  if (table->start_event(comm->chained, &out, &copy) != abi::kSuccess) return nullptr;
  return out;
}

// A slot for an event rankscope records; null (and the record counted as
// dropped) when nobody reads the ring or NCCL holds every slot.
Event* take_recorded(Comm* comm, bool step) {
  if (!process.read()) return nullptr;
  Event* e = step ? comm->take_step() : comm->take();
  if (!e) process.drop();
  return e;
}

// Records the start of an event rankscope reads, when it should; its
// handle, or null. Collectives, p2p operations and kernel channels always;
// a proxy operation when its collective or p2p operation was scheduled
// with proxy events on for rankscope (`scheduled_with_detail`: NCCL read
// its mask at the API call, before this start), and a proxy step when its
// operation was recorded.
Event* record_start(Comm* comm, const Descr& d, bool scheduled_with_detail) {
  Event* parent = parent_of(d.type, d.parent);
  if (parent && !parent->recorded) parent = nullptr;  // it only carries the chained plugin's handle
  Event* e = nullptr;
  Record r;
  switch (d.type) {
    case abi::kColl: {
      if (!(e = take_recorded(comm, false))) return nullptr;
      e->op = proto::op_from_name(d.coll->func ? d.coll->func : "");
      e->seq_number = d.coll->seq_number;
      e->peer = d.coll->root;
      e->channel = d.coll->n_channels;
      e->stop_kind = RecordKind::coll_stop;
      e->stop_writes = true;
      e->detail = scheduled_with_detail;
      fill(r, *e, RecordKind::coll_start);
      r.bytes = d.coll->count;
      r.state = e->detail ? kCollDetail : 0;
      break;
    }
    case abi::kP2p: {
      if (!(e = take_recorded(comm, false))) return nullptr;
      e->op = proto::op_from_name(d.p2p->func ? d.p2p->func : "");
      e->seq_number = comm->p2p_seq[e->op == RS_OP_SEND ? 0 : 1].fetch_add(1, std::memory_order_relaxed) + 1;
      e->peer = d.p2p->peer;
      e->channel = d.p2p->n_channels;
      e->stop_kind = RecordKind::p2p_stop;
      e->stop_writes = true;
      e->detail = scheduled_with_detail;
      fill(r, *e, RecordKind::p2p_start);
      r.bytes = d.p2p->count;
      r.state = e->detail ? kCollDetail : 0;
      break;
    }
    case abi::kKernelCh: {
      // A channel of the collective or p2p operation `parent`.
      if (!(e = take_recorded(comm, false))) return nullptr;
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
      // Its collective asked for detail; or, when no chained plugin wants
      // proxy events, they come for rankscope whatever the label says.
      const bool ours = !(static_cast<uint64_t>(chained_mask()) & abi::started_for(abi::kProxyOp));
      if (!parent || !(parent->detail || ours) || !(e = take_recorded(comm, false))) return nullptr;
      e->op = parent->op;
      e->seq_number = parent->seq_number;
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
      if (!parent || !(e = take_recorded(comm, true))) return nullptr;
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
      return nullptr;  // not read by rankscope
  }
  process.write(r);
  return e;
}

// Passes the stop of the chained plugin's event `handle` on to it.
void stop_chained(const Comm& comm, void* handle) {
  if (comm.chained_v5)
    comm.chained_v5->stop_event(handle);
  else
    comm.chained_v4->stop_event(handle);
}

// `chained_handle`: the chained plugin's handle of this event (null: none).
void* start(Comm* comm, const Descr& d, void* chained_handle) {
  const bool scheduled_with_detail = process.proxied.load(std::memory_order_relaxed);
  if (d.type == abi::kColl || d.type == abi::kP2p) comm->follow_detail();  // for the operations NCCL schedules next
  Event* e = record_start(comm, d, scheduled_with_detail);
  if (chained_handle) {
    if (!e) {  // an event only the chained plugin wants (or no reader): it carries its handle
      const bool under_step = d.type == abi::kProxyStep || d.type == abi::kNetPlugin;
      e = under_step ? comm->take_step() : comm->take();
      if (!e) {  // every slot live: the chained plugin's event ends here (its children get no parent)
        stop_chained(*comm, chained_handle);
        return nullptr;
      }
      e->recorded = false;
      e->stop_writes = false;
    }
    e->chained = chained_handle;
  }
  if (e) e->type.store(d.type, std::memory_order_relaxed);
  return e;
}

// Passes the event's stop on to the chained plugin.
void chained_stop(const Event& e) {
  if (e.chained) stop_chained(*e.comm, e.chained);
}

abi::Result stop(void* handle) {
  Event* e = event_of(handle);
  if (!e) return abi::kSuccess;
  chained_stop(*e);
  if (e->recorded && e->stop_writes) {
    Record r;
    fill(r, *e, e->stop_kind);
    process.write(r);
  }
  e->live.store(false, std::memory_order_release);  // NCCL makes no further call with it
  return abi::kSuccess;
}

abi::Result record_state(void* handle, int state, abi::StateArgs* args) {
  Event* e = event_of(handle);
  if (!e) return abi::kSuccess;
  if (e->chained) {
    if (e->comm->chained_v5)
      e->comm->chained_v5->record_event_state(e->chained, state, args);
    else
      e->comm->chained_v4->record_event_state(e->chained, state, args);
  }
  if (!e->recorded) return abi::kSuccess;
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
  auto* comm = static_cast<Comm*>(context);
  if (comm->chained) {
    if (comm->chained_v5)
      comm->chained_v5->finalize(comm->chained);
    else
      comm->chained_v4->finalize(comm->chained);
  }
  delete comm;
  process.comms.fetch_sub(1);
  return abi::kSuccess;
}

// The chained plugin's session for the communicator just made: its init
// with NCCL's arguments and the process's chained mask (NCCL's is the union).
void chain_init(Comm* comm, const abi::ProfilerV5* v5, const abi::ProfilerV4* v4, const char* name, int n_nodes,
                int nranks, int rank, abi::Logger log) {
  if (!v5 && !v4) return;
  void* context = nullptr;
  const abi::Result result = v5 ? v5->init(&context, comm->hash, &chain.mask, name, n_nodes, nranks, rank, log)
                                : v4->init(&context, &chain.mask, name, comm->hash, n_nodes, nranks, rank, log);
  if (result != abi::kSuccess || !context) return;
  comm->chained = context;
  comm->chained_v5 = v5;
  comm->chained_v4 = v4;
  comm->follow_detail();
}

}  // namespace
}  // namespace rankscope::profiler

namespace rp = rankscope::profiler;

extern "C" {
extern rp::abi::ProfilerV5 ncclProfiler_v5;
extern rp::abi::ProfilerV4 ncclProfiler_v4;
}

namespace rankscope::profiler {
namespace {

abi::Result init_v5(void** context, uint64_t comm_hash, int* mask, const char* name, int n_nodes, int nranks,
                    int rank, abi::Logger log) {
  abi::Result result = init(context, comm_hash, mask, rank);
  chain_init(static_cast<Comm*>(*context), chained(log, "ncclProfiler_v5", &ncclProfiler_v5), nullptr, name,
             n_nodes, nranks, rank, log);
  return result;
}
abi::Result init_v4(void** context, int* mask, const char* name, uint64_t comm_hash, int n_nodes, int nranks,
                    int rank, abi::Logger log) {
  abi::Result result = init(context, comm_hash, mask, rank);
  chain_init(static_cast<Comm*>(*context), nullptr, chained(log, "ncclProfiler_v4", &ncclProfiler_v4), name,
             n_nodes, nranks, rank, log);
  return result;
}

template <typename Table, typename Descriptor>
abi::Result start_any(void* context, void** handle, const Table* Comm::*table, const Descriptor& d, const Descr& fields) {
  *handle = nullptr;
  // The proxy thread's own state: not read, and passed to no chained
  // plugin (its context is the communicator that made the proxy, which may
  // be finalized while the proxy runs on for the others sharing it).
  if (fields.type == abi::kProxyCtrl) return abi::kSuccess;
  Comm* comm = owner(context, fields);
  if (!comm) return abi::kSuccess;
  void* chained = comm->*table ? chained_start(comm, comm->*table, d) : nullptr;
  *handle = start(comm, fields, chained);
  return abi::kSuccess;
}
abi::Result start_v5(void* context, void** handle, abi::EventDescrV5* d) {
  return start_any(context, handle, &Comm::chained_v5, *d,
                   Descr{d->type, d->parent, &d->coll.d, &d->p2p.d, &d->proxy_op, d->proxy_step.step, &d->kernel_ch});
}
abi::Result start_v4(void* context, void** handle, abi::EventDescrV4* d) {
  return start_any(context, handle, &Comm::chained_v4, *d,
                   Descr{d->type, d->parent, &d->coll, &d->p2p, &d->proxy_op, d->proxy_step.step, &d->kernel_ch});
}

}  // namespace
}  // namespace rankscope::profiler

extern "C" {
__attribute__((visibility("default"))) rp::abi::ProfilerV5 ncclProfiler_v5 = {
    "rankscope", rp::init_v5, rp::start_v5, rp::stop, rp::record_state, rp::finalize};
__attribute__((visibility("default"))) rp::abi::ProfilerV4 ncclProfiler_v4 = {
    "rankscope", rp::init_v4, rp::start_v4, rp::stop, rp::record_state, rp::finalize};
}
