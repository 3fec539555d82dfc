#include "node-agent/profiler_rings.h"

#include <unistd.h>

#include <algorithm>

#include "bpf/nccl_events.h"
#include "common/log.h"

namespace rankscope::agent {

namespace {
using profiler::Record;
using profiler::RecordKind;

bool is_collective(uint8_t op) {
  return op != 0 && op != RS_OP_SEND && op != RS_OP_RECV;
}
}  // namespace

ProfilerRings::ProfilerRings(std::string proc_root) : proc_root_(std::move(proc_root)) {}

ProfilerRings::~ProfilerRings() {
  for (auto& [pid, ring] : rings_) {
    ring->view.header->reader.store(0);  // the plugin goes back to counting only
    profiler::unmap_ring(ring->view);
  }
}

bool ProfilerRings::attach(uint32_t pid, uint64_t start_time) {
  if (rings_.count(pid)) return true;
  if (auto it = refused_.find(pid); it != refused_.end() && it->second == start_time) return false;
  std::string why;
  auto view = profiler::map_process_ring(proc_root_, pid, start_time, why);
  if (!view) {
    if (why.empty()) return false;  // no plugin in it (yet)
    ++counts_.refused;
    refused_[pid] = start_time;  // not looked at again while this process lives
    RS_LOG(warn, "profiler ring of process %u not read: %s", pid, why.c_str());
    return false;
  }
  auto ring = std::make_unique<Ring>();
  ring->pid = pid;
  ring->view = *view;
  ring->dropped_seen = view->header->dropped.load(std::memory_order_relaxed);
  view->header->reader.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
  rings_[pid] = std::move(ring);
  ++counts_.rings;
  return true;
}

void ProfilerRings::drain(const std::function<void(const GpuCollective&)>& out) {
  for (auto& [pid, ring] : rings_) read(*ring, out);
}

void ProfilerRings::detach(uint32_t pid, const std::function<void(const GpuCollective&)>& out) {
  refused_.erase(pid);
  auto it = rings_.find(pid);
  if (it == rings_.end()) return;
  read(*it->second, out);
  profiler::unmap_ring(it->second->view);  // the last reference: the ring is freed
  rings_.erase(it);
  --counts_.rings;
}

void ProfilerRings::read(Ring& ring, const std::function<void(const GpuCollective&)>& out) {
  Record r;
  // At most a ring's worth per drain: a writer that never stops cannot hold the agent here.
  for (uint32_t budget = ring.view.slots; budget > 0 && profiler::ring_read(ring.view, r); --budget) {
    ++counts_.records;
    take(ring, r, out);
  }
  uint64_t dropped = ring.view.header->dropped.load(std::memory_order_relaxed);
  counts_.plugin_dropped += dropped - std::min(dropped, ring.dropped_seen);
  ring.dropped_seen = std::max(dropped, ring.dropped_seen);
}

void ProfilerRings::take(Ring& ring, const Record& r, const std::function<void(const GpuCollective&)>& out) {
  if (!is_collective(r.op)) return;  // point-to-point and proxy records: not read yet
  const bool enqueue = r.kind == RecordKind::coll_start;
  const bool kernel = r.kind == RecordKind::kernel_start || r.kind == RecordKind::kernel_stop;
  if (!enqueue && !kernel) return;
  Key key{r.comm_hash, r.op, r.seq_number};
  auto [it, made] = ring.pending.try_emplace(key);
  Pending& p = it->second;
  if (made) {
    p.c.pid = ring.pid;
    p.c.comm_hash = r.comm_hash;
    p.c.rank = r.rank;
    p.c.op = r.op;
    p.c.seq_number = r.seq_number;
    p.order = ring.next_order++;
    ring.by_order.emplace(p.order, key);
    if (!enqueue) ++counts_.unmatched;
  }
  if (enqueue) {
    p.c.enqueued_ns = r.host_ns;
    p.c.count = r.bytes;
    p.channels = r.channel;
  } else if (r.kind == RecordKind::kernel_start) {
    ++p.channels_started;
    p.gpu_start = std::min(p.gpu_start, r.gpu_ns);
    ring.gpu_to_host = std::min(ring.gpu_to_host, static_cast<int64_t>(r.host_ns - r.gpu_ns));
  } else {
    ++p.channels_stopped;
    p.gpu_end = std::max(p.gpu_end, r.gpu_ns);
  }
  const uint32_t channels = p.channels ? p.channels : p.channels_started;
  if (p.channels_stopped > 0 && p.channels_stopped >= channels) {
    p.c.kernel_start_ns = static_cast<uint64_t>(static_cast<int64_t>(p.gpu_start) + ring.gpu_to_host);
    p.c.kernel_end_ns = static_cast<uint64_t>(static_cast<int64_t>(p.gpu_end) + ring.gpu_to_host);
    out(p.c);
    // A stream runs its collectives in order: those of this communicator
    // and op still pending before it lost a record (a full ring).
    auto first = ring.pending.lower_bound(Key{r.comm_hash, r.op, 0});
    for (auto e = first; e != std::next(it); ++e) ring.by_order.erase(e->second.order);
    ring.pending.erase(first, std::next(it));
    return;
  }
  if (ring.pending.size() > kPendingPerRing) {  // the oldest goes
    ring.pending.erase(ring.by_order.begin()->second);
    ring.by_order.erase(ring.by_order.begin());
  }
}

std::vector<GpuOpenCollective> ProfilerRings::open() const {
  std::vector<GpuOpenCollective> out;
  for (const auto& [pid, ring] : rings_) {
    const Key* last = nullptr;
    for (const auto& [key, p] : ring->pending) {
      if (p.c.enqueued_ns == 0) continue;  // its enqueue was not seen
      if (last && std::get<0>(*last) == std::get<0>(key) && std::get<1>(*last) == std::get<1>(key)) continue;
      last = &key;
      GpuOpenCollective o;
      o.pid = pid;
      o.comm_hash = p.c.comm_hash;
      o.rank = p.c.rank;
      o.op = p.c.op;
      o.seq_number = p.c.seq_number;
      o.enqueued_ns = p.c.enqueued_ns;
      if (p.channels_started > 0 && ring->gpu_to_host != INT64_MAX)
        o.kernel_start_ns = static_cast<uint64_t>(static_cast<int64_t>(p.gpu_start) + ring->gpu_to_host);
      out.push_back(o);
    }
  }
  return out;
}

}  // namespace rankscope::agent
