#pragma once
// The profiler plugin's per-process ring: fixed-size records in shared
// memory (a sealed memfd named rankscope-nccl-ring), written by NCCL's threads through
// the plugin and drained by the node agent. A bounded multi-producer,
// single-consumer queue (each slot carries its own sequence number, as in
// Vyukov's bounded queue): a writer takes a slot with one compare-and-swap,
// fills it and publishes it with a release store; no lock, no allocation
// and no system call on NCCL's path. A full ring, or one no agent reads,
// drops the record and counts it.
//
// The layout is the contract between the plugin and the agent (they may be
// different builds): a reader checks magic, version and record size first.
//
// The process that writes the ring may be hostile to the agent that reads
// it (any user can load a plugin of their own). So the ring is a memfd
// sealed against shrinking (a truncated mapping would kill its reader with
// SIGBUS), found through the process's own descriptors rather than a path
// it could redirect, and read with the reader's own copy of its size, at
// most one ring's worth of records per drain.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace rankscope::profiler {

constexpr uint32_t kRingMagic = 0x52534e50;  // "RSNP"
constexpr uint32_t kRingVersion = 1;
constexpr uint32_t kRingSlots = 1u << 14;  // 16,384 records, 1 MiB: ~1 s of a busy rank's events

// What a record says happened (the plugin's events, flattened).
enum class RecordKind : uint8_t {
  coll_start = 1,  // NCCL scheduled collective `seq_number` of `comm_hash`
  coll_stop = 2,   // ...and enqueued its kernels (not: finished)
  p2p_start = 3,   // a Send or Recv to/from `peer`
  p2p_stop = 4,
  kernel_start = 5,    // a channel's kernel started: `gpu_ns` from %globaltimer
  kernel_stop = 6,     // ...and stopped
  proxy_op_start = 7,  // the network proxy took one channel's transfer with `peer`: `bytes` planned
  proxy_op_stop = 8,
  proxy_step = 9,        // a step (chunk) of it started (`state` 0, `bytes` its step number) or
                         // changed state (`state`: NCCL's state number, `bytes` moved so far)
  proxy_step_stop = 10,  // ...and ended (its data sent or received)
};

// Proxy records: `event` is the proxy operation's or step's own id, and
// `state` carries the direction in its high bit.
constexpr uint8_t kProxySend = 0x80;
constexpr uint8_t kProxyStateMask = 0x7f;
// coll_start and p2p_start: `state` holds this when NCCL reports the
// operation's proxy work (proxy events were asked for when NCCL scheduled
// it); 0 from plugins that predate it.
constexpr uint8_t kCollDetail = 0x01;

struct alignas(64) Record {
  std::atomic<uint64_t> sequence;  // the queue's: position + 1 once written
  uint64_t comm_hash;              // NCCL's commHash: equal on every rank
  uint64_t seq_number;             // the collective's, per communicator (0 for p2p)
  uint64_t host_ns;                // CLOCK_MONOTONIC when the plugin was called
  uint64_t gpu_ns;                 // kernel events: %globaltimer; 0 otherwise
  uint64_t bytes;                  // element count (coll, p2p), bytes moved (proxy step)
  int32_t rank;                    // in the communicator
  int32_t peer;                    // p2p and proxy: the other rank; coll: its root; -1 when none
  uint32_t event;                  // links a stop to its start (and kernels and proxy work to their collective)
  RecordKind kind;
  uint8_t op;  // enum rs_nccl_op (bpf/nccl_events.h); 0 when unknown
  uint8_t channel;
  uint8_t state;  // proxy_step: NCCL's state number; coll_start, p2p_start: kCollDetail or 0
};
static_assert(sizeof(Record) == 64);

struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t record_size;
  uint32_t slots;  // a power of two
  uint32_t pid;
  uint32_t reserved;
  uint64_t start_time;            // /proc/PID/stat field 22: a reused pid is another process
  std::atomic<uint32_t> reader;   // the agent's pid while it drains the ring; 0: nobody reads (records are dropped)
  std::atomic<uint32_t> detail;   // set by the agent: proxy events wanted too (read by NCCL at each operation)
  std::atomic<uint64_t> written;  // records written since the ring was made
  std::atomic<uint64_t> dropped;  // records not written: nobody reading, or the ring full
  alignas(64) std::atomic<uint64_t> head;  // next position writers take
  alignas(64) std::atomic<uint64_t> tail;  // next position the reader takes
};

// The ring as mapped: the header, then `slots` records. `slots` is the
// mapper's own (checked once), never the header's again: the writer may
// change the header.
struct RingView {
  RingHeader* header = nullptr;
  Record* records = nullptr;
  uint32_t slots = 0;
};

constexpr size_t ring_bytes(uint32_t slots) {
  return sizeof(RingHeader) + size_t{slots} * sizeof(Record);
}

// memfd_create's name of a ring; /proc/PID/fd shows it as "/memfd:NAME (deleted)".
constexpr const char* kRingMemfdName = "rankscope-nccl-ring";
// The seals a ring carries: its size is fixed for good.
constexpr int kRingSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// This process's start time (/proc/self/stat field 22), which a ring's
// header carries: a ring of an earlier process of the same pid, or of a
// parent, is not this process's.
inline uint64_t own_start_time() {
  char text[1024];
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
  if (fd >= 0) close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  const char* p = strrchr(text, ')');  // the command name (field 2) may hold ')'
  for (int field = 2; field < 22 && p; ++field) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, nullptr, 10) : 0;
}

// The ring behind descriptor `fd`, checked (sealed, a size matching its
// header, this build's layout) and mapped read-write; nullopt with `why`.
// `unfinished` (where given) says whether the refusal is what a ring being
// made looks like for a moment (not yet sized, sealed or initialised):
// worth another look shortly.
inline std::optional<RingView> map_ring(int fd, std::string& why, bool* unfinished = nullptr) {
  if (unfinished) *unfinished = false;
  struct stat st {};
  void* map = MAP_FAILED;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    why = "it is not sealed against resizing";
    if (unfinished) *unfinished = true;
  } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) < sizeof(RingHeader)) {
    why = "it is smaller than a ring's header";
  }
  else if ((map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
           MAP_FAILED)
    why = "it cannot be mapped";
  if (map == MAP_FAILED) return std::nullopt;
  auto* h = static_cast<RingHeader*>(map);
  const uint32_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);  // published last (ring_init)
  const uint32_t slots = h->slots;
  if (magic == 0) {
    why = "its header is not written";  // sealed and mapped by its maker, not yet initialised
    if (unfinished) *unfinished = true;
  } else if (magic != kRingMagic || h->version != kRingVersion || h->record_size != sizeof(Record))
    why = "another layout (another plugin build)";
  else if (slots == 0 || (slots & (slots - 1)) != 0 || static_cast<size_t>(st.st_size) != ring_bytes(slots))
    why = "its size does not match its header";
  else
    return RingView{h, reinterpret_cast<Record*>(static_cast<char*>(map) + sizeof(RingHeader)), slots};
  munmap(map, static_cast<size_t>(st.st_size));
  return std::nullopt;
}

// Process `pid`'s ring (the one it made: its header names `pid` and
// `start_time`, /proc/PID/stat field 22; a child keeps its parent's
// descriptors), found among its descriptors (PROC/PID/fd) and mapped;
// nullopt with `why` when it has none (`why` empty) or it is refused.
inline std::optional<RingView> map_process_ring(const std::string& proc_root, uint32_t pid, uint64_t start_time,
                                                std::string& why, bool* unfinished = nullptr) {
  why.clear();
  if (unfinished) *unfinished = false;
  const std::string dir = proc_root + "/" + std::to_string(pid) + "/fd";
  const std::string want = std::string("/memfd:") + kRingMemfdName + " (deleted)";
  DIR* d = opendir(dir.c_str());
  if (!d) return std::nullopt;
  std::optional<RingView> found;
  char target[128];
  while (dirent* entry = readdir(d)) {
    const std::string link = dir + "/" + entry->d_name;
    ssize_t n = readlink(link.c_str(), target, sizeof target);
    if (n != static_cast<ssize_t>(want.size()) || want.compare(0, want.size(), target, n) != 0) continue;
    int fd = open(link.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    bool this_unfinished = false;
    found = map_ring(fd, why, &this_unfinished);
    if (unfinished) *unfinished = *unfinished || this_unfinished;
    close(fd);
    if (found && found->header->pid == pid && found->header->start_time == start_time) break;
    if (found) {
      why = "it was made by another process (of that pid, or its parent)";
      munmap(found->header, ring_bytes(found->slots));
      found.reset();
    }
  }
  closedir(d);
  if (found) why.clear();
  return found;
}

inline void unmap_ring(RingView ring) {
  if (ring.header) munmap(ring.header, ring_bytes(ring.slots));
}

// Sets up a zeroed mapping of ring_bytes(slots) as an empty ring. The magic
// is written last: a reader that sees it sees the rest.
inline void ring_init(RingView& ring, uint32_t slots, uint32_t pid, uint64_t start_time) {
  RingHeader* h = ring.header;
  h->version = kRingVersion;
  h->record_size = sizeof(Record);
  h->slots = slots;
  ring.slots = slots;
  h->pid = pid;
  h->start_time = start_time;
  for (uint32_t i = 0; i < slots; ++i) ring.records[i].sequence.store(i, std::memory_order_relaxed);
  h->head.store(0, std::memory_order_relaxed);
  h->tail.store(0, std::memory_order_relaxed);
  __atomic_store_n(&h->magic, kRingMagic, __ATOMIC_RELEASE);
}

// Writes `record` (its sequence ignored); false when dropped (and counted).
inline bool ring_write(RingView ring, const Record& record) {
  RingHeader* h = ring.header;
  if (h->reader.load(std::memory_order_relaxed) == 0) {
    h->dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const uint64_t mask = ring.slots - 1;
  uint64_t pos = h->head.load(std::memory_order_relaxed);
  Record* slot;
  for (;;) {
    slot = &ring.records[pos & mask];
    uint64_t seq = slot->sequence.load(std::memory_order_acquire);
    int64_t diff = static_cast<int64_t>(seq - pos);
    if (diff == 0) {
      if (h->head.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
    } else if (diff < 0) {
      h->dropped.fetch_add(1, std::memory_order_relaxed);  // full: the reader is a whole ring behind
      return false;
    } else {
      pos = h->head.load(std::memory_order_relaxed);
    }
  }
  slot->comm_hash = record.comm_hash;
  slot->seq_number = record.seq_number;
  slot->host_ns = record.host_ns;
  slot->gpu_ns = record.gpu_ns;
  slot->bytes = record.bytes;
  slot->rank = record.rank;
  slot->peer = record.peer;
  slot->event = record.event;
  slot->kind = record.kind;
  slot->op = record.op;
  slot->channel = record.channel;
  slot->state = record.state;
  slot->sequence.store(pos + 1, std::memory_order_release);
  h->written.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The next record, copied into `out`; false when none is ready. One reader.
inline bool ring_read(RingView ring, Record& out) {
  RingHeader* h = ring.header;
  const uint64_t pos = h->tail.load(std::memory_order_relaxed);
  Record& slot = ring.records[pos & (ring.slots - 1)];
  if (slot.sequence.load(std::memory_order_acquire) != pos + 1) return false;
  out.comm_hash = slot.comm_hash;
  out.seq_number = slot.seq_number;
  out.host_ns = slot.host_ns;
  out.gpu_ns = slot.gpu_ns;
  out.bytes = slot.bytes;
  out.rank = slot.rank;
  out.peer = slot.peer;
  out.event = slot.event;
  out.kind = slot.kind;
  out.op = slot.op;
  out.channel = slot.channel;
  out.state = slot.state;
  slot.sequence.store(pos + ring.slots, std::memory_order_release);
  h->tail.store(pos + 1, std::memory_order_relaxed);
  return true;
}

}  // namespace rankscope::profiler
