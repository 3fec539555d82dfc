#include "node-agent/profiler_rings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
    munmap(ring->map, ring->bytes);
  }
}

bool ProfilerRings::attach(uint32_t pid, uint64_t start_time) {
  if (rings_.count(pid)) return true;
  auto ring = std::make_unique<Ring>();
  ring->pid = pid;
  ring->path = proc_root_ + "/" + std::to_string(pid) + "/root/dev/shm" + profiler::ring_name(pid);
  int fd = open(ring->path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;  // no plugin in it (yet)
  struct stat st {};
  const size_t header = sizeof(profiler::RingHeader);
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= header)
    map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  auto refuse = [&](const char* why) {
    if (map != MAP_FAILED) munmap(map, static_cast<size_t>(st.st_size));
    ++counts_.refused;
    RS_LOG(warn, "profiler ring %s not read: %s", ring->path.c_str(), why);
    return false;
  };
  if (map == MAP_FAILED) return refuse("cannot map it");
  auto* h = static_cast<profiler::RingHeader*>(map);
  if (h->magic != profiler::kRingMagic || h->version != profiler::kRingVersion || h->record_size != sizeof(Record))
    return refuse("another layout (another plugin build)");
  if (h->slots == 0 || (h->slots & (h->slots - 1)) != 0 ||
      static_cast<size_t>(st.st_size) < profiler::ring_bytes(h->slots))
    return refuse("its size does not match its header");
  if (h->pid != pid || h->start_time != start_time) return refuse("it was made by another process of that pid");
  ring->map = map;
  ring->bytes = static_cast<size_t>(st.st_size);
  ring->view.header = h;
  ring->view.records = reinterpret_cast<Record*>(static_cast<char*>(map) + header);
  ring->dropped_seen = h->dropped.load(std::memory_order_relaxed);
  h->reader.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
  rings_[pid] = std::move(ring);
  ++counts_.rings;
  return true;
}

void ProfilerRings::drain(const std::function<void(const GpuCollective&)>& out) {
  for (auto& [pid, ring] : rings_) read(*ring, out);
}

void ProfilerRings::detach(uint32_t pid, const std::function<void(const GpuCollective&)>& out) {
  auto it = rings_.find(pid);
  if (it == rings_.end()) return;
  read(*it->second, out);
  unlink(it->second->path.c_str());  // the plugin leaves a read ring to its reader
  munmap(it->second->map, it->second->bytes);
  rings_.erase(it);
  --counts_.rings;
}

void ProfilerRings::read(Ring& ring, const std::function<void(const GpuCollective&)>& out) {
  Record r;
  while (profiler::ring_read(ring.view, r)) {
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
    ring.pending.erase(it);
    return;
  }
  if (ring.pending.size() > kPendingPerRing) {
    auto oldest = std::min_element(ring.pending.begin(), ring.pending.end(),
                                   [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    ring.pending.erase(oldest);
  }
}

}  // namespace rankscope::agent
