#pragma once
// The profiler plugin's per-process ring: fixed-size records in shared
// memory (/dev/shm/rankscope-nccl-<pid>), written by NCCL's threads through
// the plugin and drained by the node agent. A bounded multi-producer,
// single-consumer queue (each slot carries its own sequence number, as in
// Vyukov's bounded queue): a writer takes a slot with one compare-and-swap,
// fills it and publishes it with a release store; no lock, no allocation
// and no system call on NCCL's path. A full ring, or one no agent reads,
// drops the record and counts it.
//
// The layout is the contract between the plugin and the agent (they may be
// different builds): a reader checks magic, version and record size first.
#include <atomic>
#include <cstddef>
#include <cstdint>
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
  proxy_op_start = 7,  // the network proxy took one channel's transfer with `peer`
  proxy_op_stop = 8,
  proxy_step = 9,  // a step of it changed state (`state`), `bytes` moved so far
};

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
  uint8_t state;  // proxy_step: NCCL's state number
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

// The ring as mapped: the header, then `slots` records.
struct RingView {
  RingHeader* header = nullptr;
  Record* records = nullptr;
  size_t bytes() const { return sizeof(RingHeader) + header->slots * sizeof(Record); }
};

constexpr size_t ring_bytes(uint32_t slots) {
  return sizeof(RingHeader) + size_t{slots} * sizeof(Record);
}

// /dev/shm/rankscope-nccl-<pid>: shm_open's name of a process's ring.
constexpr const char* kRingFilePrefix = "rankscope-nccl-";
inline std::string ring_name(uint32_t pid) {
  return "/" + std::string(kRingFilePrefix) + std::to_string(pid);
}

// Sets up a zeroed mapping of ring_bytes(slots) as an empty ring.
inline void ring_init(RingView ring, uint32_t slots, uint32_t pid, uint64_t start_time) {
  RingHeader* h = ring.header;
  h->magic = kRingMagic;
  h->version = kRingVersion;
  h->record_size = sizeof(Record);
  h->slots = slots;
  h->pid = pid;
  h->start_time = start_time;
  for (uint32_t i = 0; i < slots; ++i) ring.records[i].sequence.store(i, std::memory_order_relaxed);
  h->head.store(0, std::memory_order_relaxed);
  h->tail.store(0, std::memory_order_relaxed);
}

// Writes `record` (its sequence ignored); false when dropped (and counted).
inline bool ring_write(RingView ring, const Record& record) {
  RingHeader* h = ring.header;
  if (h->reader.load(std::memory_order_relaxed) == 0) {
    h->dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const uint64_t mask = h->slots - 1;
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
  Record& slot = ring.records[pos & (h->slots - 1)];
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
  slot.sequence.store(pos + h->slots, std::memory_order_release);
  h->tail.store(pos + 1, std::memory_order_relaxed);
  return true;
}

}  // namespace rankscope::profiler
