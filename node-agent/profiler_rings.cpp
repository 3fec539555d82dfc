#include "node-agent/profiler_rings.h"

#include <unistd.h>

#include <algorithm>

#include "bpf/nccl_events.h"
#include "common/log.h"
#include "nccl-profiler/abi.h"

namespace rankscope::agent {

namespace {
using profiler::Record;
using profiler::RecordKind;

bool is_collective(uint8_t op) {
  return op != 0 && op != RS_OP_SEND && op != RS_OP_RECV;
}
bool is_p2p(uint8_t op) { return op == RS_OP_SEND || op == RS_OP_RECV; }
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
  bool unfinished = false;
  auto view = profiler::map_process_ring(proc_root_, pid, start_time, why, &unfinished);
  if (!view) {
    if (why.empty()) {  // no plugin in it (yet)
      unfinished_.erase(pid);
      return false;
    }
    if (unfinished) {  // its plugin is making it now
      Unfinished& u = unfinished_[pid];
      if (u.start_time != start_time) u = Unfinished{start_time, 0};
      if (++u.tries < kUnfinishedTries) return false;
    }
    unfinished_.erase(pid);
    ++counts_.refused;
    refused_[pid] = start_time;  // not looked at again while this process lives
    RS_LOG(warn, "profiler ring of process %u not read: %s", pid, why.c_str());
    return false;
  }
  unfinished_.erase(pid);
  auto ring = std::make_unique<Ring>();
  ring->pid = pid;
  ring->view = *view;
  ring->dropped_seen = view->header->dropped.load(std::memory_order_relaxed);
  view->header->reader.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
  ring->detail = detail_all_;
  view->header->detail.store(ring->detail ? 1 : 0, std::memory_order_relaxed);
  rings_[pid] = std::move(ring);
  ++counts_.rings;
  return true;
}

void ProfilerRings::drain(const std::function<void(const GpuCollective&)>& out) {
  if (!unfinished_.empty()) {
    std::vector<std::pair<uint32_t, uint64_t>> again;
    for (const auto& [pid, u] : unfinished_) again.emplace_back(pid, u.start_time);
    for (const auto& [pid, start_time] : again)
      if (attach(pid, start_time)) RS_LOG(info, "reading the GPU side of process %u (NCCL profiler plugin)", pid);
  }
  for (auto& [pid, ring] : rings_) read(*ring, out);
}

void ProfilerRings::detach(uint32_t pid, const std::function<void(const GpuCollective&)>& out) {
  refused_.erase(pid);
  unfinished_.erase(pid);
  auto it = rings_.find(pid);
  if (it == rings_.end()) return;
  read(*it->second, out);
  // What it finished whose proxy records never came is sent all the same.
  for (auto& [key, p] : it->second->pending)
    if (p.kernels_done()) send(*it->second, p, out);
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

bool ProfilerRings::Pending::kernels_done() const {
  const uint32_t n = channels ? channels : channels_started;
  return channels_stopped > 0 && channels_stopped >= n;
}

void ProfilerRings::Pending::add_link_wait(int32_t peer, uint8_t channel, uint64_t start, uint64_t end) {
  auto link = std::find_if(links.begin(), links.end(),
                           [&](const Link& l) { return l.peer == peer && l.channel == channel; });
  if (link == links.end()) {
    if (links.size() < kLinksPerCollective) links.push_back(Link{peer, channel, start, end, 0});
  } else if (start > link->end) {  // a new run: NCCL posts a channel's steps in order
    link->total += link->end - link->start;
    link->start = start;
    link->end = end;
  } else {
    link->start = std::min(link->start, start);
    link->end = std::max(link->end, end);
  }
}

void ProfilerRings::take(Ring& ring, const Record& r, const std::function<void(const GpuCollective&)>& out) {
  const bool p2p = is_p2p(r.op);
  if (!is_collective(r.op) && !p2p) return;
  if (r.kind >= RecordKind::proxy_op_start && r.kind <= RecordKind::proxy_step_stop) {
    if (!p2p) take_proxy(ring, r, out);  // a Send's or Recv's proxy work: not read
    return;
  }
  const bool enqueue = r.kind == (p2p ? RecordKind::p2p_start : RecordKind::coll_start);
  const bool kernel = r.kind == RecordKind::kernel_start || r.kind == RecordKind::kernel_stop;
  if (!enqueue && !kernel) return;
  // A Send's or Recv's kernels are sent too, for their ends: the collector
  // judges a kernel from the end of the one ahead of it on its stream, and a
  // Recv that waited for a slow stage's data holds up what follows it. The
  // plugin numbers them from 1 per communicator and op (NCCL does not).
  if (p2p && r.seq_number == 0) return;
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
    p.p2p = p2p;
    ring.by_order.emplace(p.order, key);
    if (!enqueue) ++counts_.unmatched;
  }
  if (enqueue) {
    if (!p2p && note_comm(ring, r.comm_hash) && !ring.detail && wants_detail(ring, detail_all_, detail_comms_)) {
      ring.detail = true;  // a communicator asked for before this process's first collective of it
      ring.view.header->detail.store(1, std::memory_order_relaxed);
    }
    p.c.enqueued_ns = r.host_ns;
    p.c.count = r.bytes;
    p.channels = r.channel;
    p.detail = !p2p && (r.state & profiler::kCollDetail) != 0;
  } else if (r.kind == RecordKind::kernel_start) {
    ++p.channels_started;
    p.gpu_start = std::min(p.gpu_start, r.gpu_ns);
    ring.gpu_to_host = std::min(ring.gpu_to_host, static_cast<int64_t>(r.host_ns - r.gpu_ns));
  } else {
    ++p.channels_stopped;
    p.gpu_end = std::max(p.gpu_end, r.gpu_ns);
  }
  if (p.kernels_done()) {
    finish_if_done(ring, it, out);
    return;
  }
  if (ring.pending.size() > kPendingPerRing) evict_oldest(ring, out);
}

void ProfilerRings::evict_oldest(Ring& ring, const std::function<void(const GpuCollective&)>& out) {
  auto oldest = ring.pending.find(ring.by_order.begin()->second);
  ring.by_order.erase(ring.by_order.begin());
  if (oldest == ring.pending.end()) return;
  if (oldest->second.kernels_done()) send(ring, oldest->second, out);  // held for proxy records that were lost
  ring.pending.erase(oldest);
}

// NCCL's proxy thread moves a collective's data over the network, one
// operation per channel and peer, in steps (chunks). A send step is posted
// to the network (SendWait) once the GPU filled it, and stops when the
// network is done with it: that span is the link's own time, whatever the
// other ranks did. A proxy record joins its collective by (comm hash, op,
// seqNumber); one whose collective is not pending is not counted.
void ProfilerRings::take_proxy(Ring& ring, const Record& r, const std::function<void(const GpuCollective&)>& out) {
  const bool send = (r.state & profiler::kProxySend) != 0;
  const uint8_t state = r.state & profiler::kProxyStateMask;
  auto it = ring.pending.find(Key{r.comm_hash, r.op, r.seq_number});
  if (it != ring.pending.end()) it->second.proxy_seen = true;
  switch (r.kind) {
    case RecordKind::proxy_op_start:
      if (it != ring.pending.end() && it->second.proxy_open < kProxyOpsPerCollective) ++it->second.proxy_open;
      return;
    case RecordKind::proxy_op_stop:
      if (it == ring.pending.end() || it->second.proxy_open == 0) return;
      --it->second.proxy_open;
      if (it->second.kernels_done()) finish_if_done(ring, it, out);
      return;
    case RecordKind::proxy_step: {
      if (!send || r.peer < 0 || r.peer == r.rank) return;
      const Ring::StepKey id{r.comm_hash, r.rank, r.event};
      if (state == 0) {
        // Steps whose stop was lost (a full ring): the oldest go.
        while (ring.steps.size() >= kStepsPerRing && !ring.step_order.empty()) {
          ring.steps.erase(ring.step_order.front());
          ring.step_order.pop_front();
        }
        while (ring.step_order.size() >= 2 * kStepsPerRing) {  // mostly stopped long ago
          ring.steps.erase(ring.step_order.front());
          ring.step_order.pop_front();
        }
        ring.steps[id] = Step{r.seq_number, r.op, r.channel, r.peer, 0};
        ring.step_order.push_back(id);
      } else if (state == profiler::abi::kProxyStepSendWait) {
        if (auto step = ring.steps.find(id); step != ring.steps.end()) step->second.posted_ns = r.host_ns;
      }
      return;
    }
    case RecordKind::proxy_step_stop: {
      auto step = ring.steps.find(Ring::StepKey{r.comm_hash, r.rank, r.event});
      if (step == ring.steps.end()) return;
      if (step->second.posted_ns != 0 && r.host_ns > step->second.posted_ns && it != ring.pending.end())
        it->second.add_link_wait(step->second.peer, step->second.channel, step->second.posted_ns, r.host_ns);
      ring.steps.erase(step);
      return;
    }
    default:
      return;
  }
}

void ProfilerRings::finish_if_done(Ring& ring, std::map<Key, Pending>::iterator it,
                                   const std::function<void(const GpuCollective&)>& out) {
  if (it->second.proxy_open > 0) return;  // its data is still moving: its link waits are not all known
  const auto [comm, op, seq] = it->first;
  if (it->second.p2p) {
    // Sends and Recvs to different peers finish in any order.
    ring.by_order.erase(it->second.order);
    send(ring, it->second, out);
    ring.pending.erase(it);
    return;
  }
  // A stream runs its collectives in order: those of this communicator and
  // op still pending before it are sent if their kernels stopped (their
  // proxy work lost a record), else they lost one (a full ring).
  auto first = ring.pending.lower_bound(Key{comm, op, 0});
  for (auto e = first; e != std::next(it); ++e) {
    Pending& p = e->second;
    ring.by_order.erase(p.order);
    if (p.kernels_done()) send(ring, p, out);
  }
  ring.pending.erase(first, std::next(it));
}

void ProfilerRings::send(const Ring& ring, Pending& p, const std::function<void(const GpuCollective&)>& out) {
  p.c.kernel_start_ns = static_cast<uint64_t>(static_cast<int64_t>(p.gpu_start) + ring.gpu_to_host);
  p.c.kernel_end_ns = static_cast<uint64_t>(static_cast<int64_t>(p.gpu_end) + ring.gpu_to_host);
  for (const auto& link : p.links) {  // the channel that waited longest, of the peer that waited longest
    const uint64_t wait = link.total + (link.end - link.start);
    if (wait > p.c.link_wait_ns) {
      p.c.link_wait_ns = wait;
      p.c.link_peer = link.peer;
    }
  }
  out(p.c);
}

bool ProfilerRings::wants_detail(const Ring& ring, bool all, const std::vector<uint64_t>& comms) const {
  if (all) return true;
  for (const auto& [comm, last] : ring.comms)
    if (std::binary_search(comms.begin(), comms.end(), comm)) return true;
  return false;
}

bool ProfilerRings::note_comm(Ring& ring, uint64_t comm) {
  const uint64_t order = ++ring.comm_notes;
  auto [it, made] = ring.comms.try_emplace(comm, order);
  it->second = order;
  if (made && ring.comms.size() > kCommsPerRing) {
    auto least = std::min_element(ring.comms.begin(), ring.comms.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    ring.comms.erase(least);  // never the one just noted: its order is the newest
  }
  return made;
}

void ProfilerRings::set_detail(bool all, const std::vector<uint64_t>& comms) {
  std::vector<uint64_t> sorted = comms;
  std::sort(sorted.begin(), sorted.end());
  detail_all_ = all;
  detail_comms_ = std::move(sorted);
  for (auto& [pid, ring] : rings_) {
    const bool on = wants_detail(*ring, detail_all_, detail_comms_);
    if (on == ring->detail) continue;
    ring->detail = on;
    ring->view.header->detail.store(on ? 1 : 0, std::memory_order_relaxed);
  }
}

size_t ProfilerRings::detailed() const {
  size_t n = 0;
  for (const auto& [pid, ring] : rings_) n += ring->detail ? 1 : 0;
  return n;
}

std::vector<GpuOpenCollective> ProfilerRings::open() const {
  std::vector<GpuOpenCollective> out;
  for (const auto& [pid, ring] : rings_) {
    // Per collective, its send step handed to the network longest ago.
    std::map<Key, const Step*> oldest_send;
    for (const auto& [id, step] : ring->steps) {
      if (step.posted_ns == 0) continue;
      const Step*& o = oldest_send[Key{std::get<0>(id), step.op, step.seq}];
      if (!o || step.posted_ns < o->posted_ns) o = &step;
    }
    const Key* last = nullptr;
    for (const auto& [key, p] : ring->pending) {
      if (p.c.enqueued_ns == 0 || p.kernels_done()) continue;  // its enqueue was not seen, or only its proxy work goes on
      if (p.p2p) continue;  // a Send or Recv: the hangs judge collectives
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
      o.detail = p.detail;
      o.proxy_steps = p.proxy_seen;
      if (auto send = oldest_send.find(key); send != oldest_send.end()) {
        o.send_peer = send->second->peer;
        o.send_since_ns = send->second->posted_ns;
      }
      out.push_back(o);
    }
  }
  return out;
}

}  // namespace rankscope::agent
