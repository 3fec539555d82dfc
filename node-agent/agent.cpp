#include "node-agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "node-agent/attach.h"
#include "node-agent/discover.h"
#include "node-agent/drain.h"
#include "node-agent/host.h"
#include "node-agent/profiler_rings.h"
#include "node-agent/spool.h"
#include "node-agent/summarise.h"
#include "node-agent/transport.h"
#include "proto/agent_wire.h"
#include "proto/codec.h"

namespace rankscope::agent {

namespace wire = ::rankscope::proto::wire;

namespace {
constexpr uint64_t kMs = 1'000'000ull;
// The loop's tick: records are drained from the ring buffer on it, not on
// each record's wakeup (at thousands of calls per second a wakeup per record
// costs the agent a tenth of a core and the traced call a kernel wakeup;
// docs/benchmarks.md). Records wait at most this long, within a batch
// interval; the BPF ring (4 MiB) and a profiler ring (16,384 records) hold
// far more than a tick of a busy node. A tick costs the idle agent about
// 75 us (its poll, the transport's resend scan): 50 ms instead of 25 took
// it from 0.50% of a core to 0.35% (docs/benchmarks.md).
constexpr int kTickMs = 50;
// A storm of calls (a user's stand-in libnccl.so in a loop on many cores)
// can leave the summariser more than one batch carries (proto/limits.h):
// past this many records waiting, up to kMoreBatches more go at once while
// the batches in memory take less than half their bound (more would only
// push out the oldest, unacknowledged), so that the agent's backlog
// moves to the transport's bounded queue and spool.
constexpr size_t kMoreBatchesAt = 1 << 16;
constexpr int kMoreBatches = 15;

void attach_library(NcclProbes& probes, Discovery& discovery, const LibraryFile& library, const Options& options) {
  discovery.remember(library);
  if (library.kind == LibraryKind::cudart && !options.cuda_waits) return;
  if (library.kind == LibraryKind::libc && !options.setenv_probe) return;
  auto attached = probes.attach(library);
  if (!attached) {
    RS_LOG(warn, "not tracing %s: %s", library.path.c_str(), attached.error().message.c_str());
    return;
  }
  RS_LOG(info, "probing %zu %s functions in %s%s", attached->functions.size(), library_kind_name(library.kind),
         library.path.c_str(),
         attached->missing.empty() ? "" : (" (" + std::to_string(attached->missing.size()) + " absent)").c_str());
}
// The configured libraries (--nccl-lib) and those in the standard places;
// false after logging a configured one that does not exist.
bool attach_known_libraries(NcclProbes& bpf, Discovery& discovery, const Options& options) {
  for (const auto& path : options.nccl_libs) {
    auto library = Discovery::from_path(path);
    if (!library) {
      RS_LOG(error, "--nccl-lib %s: no such file", path.c_str());
      return false;
    }
    attach_library(bpf, discovery, *library, options);
  }
  for (const auto& path : Discovery::standard_locations()) {
    if (auto library = Discovery::from_path(path); library && !discovery.known(*library))
      attach_library(bpf, discovery, *library, options);
  }
  return true;
}

// The spool of unacknowledged batches (none without --spool-dir); nullopt
// after logging why it cannot be opened.
std::optional<std::unique_ptr<Spool>> open_spool(const Options& options) {
  if (options.spool_dir.empty()) return std::unique_ptr<Spool>();
  Spool::Limits limits;
  limits.max_bytes = options.spool_max_bytes;
  // At least 8 segments, so that a full spool drops an eighth, not all.
  limits.segment_bytes = std::clamp<uint64_t>(options.spool_max_bytes / 8, 64u << 10, 64u << 20);
  auto opened = Spool::open(options.spool_dir + "/" + options.node, limits);
  if (!opened) {
    RS_LOG(error, "%s (give --spool-dir a writable folder, or --spool-dir \"\" to keep unacked batches in memory only)",
           opened.error().message.c_str());
    return std::nullopt;
  }
  if ((*opened)->damage().bad_tails)
    RS_LOG(warn, "spool %s: %llu damaged segment tail(s) skipped (%llu bytes), counted as spool_damaged",
           (*opened)->dir().c_str(), static_cast<unsigned long long>((*opened)->damage().bad_tails),
           static_cast<unsigned long long>((*opened)->damage().skipped_bytes));
  return std::move(*opened);
}

// Every count of records lost or unmatched that the agent knows now
// (common/drops.h): BPF's, the summariser's and the transport's.
DropCounts drop_counts(const NcclProbes& bpf, const Summariser& summariser, const Transport& transport,
                       const ProfilerRings& rings) {
  DropCounts drops = bpf.drops();
  drops.profiler_dropped = rings.counts().plugin_dropped;
  drops.unknown_comm = summariser.unknown_comm_records();
  drops.malformed = summariser.malformed_records();
  drops.send_queue_full = transport.discarded_batches();
  drops.lost_records = transport.lost_records();
  drops.spool_damaged = transport.spool_damaged();
  return drops;
}

// One batch of what the summariser holds for `key` ("": everything, without
// a fleet), with the drop counters and the clock samples taken against the
// collector it goes to, handed to the transport. `announce`: only the key's
// processes and communicators, again, ahead of its batches not yet
// acknowledged (its new owner knows neither).
void send_batch(NcclProbes& bpf, Summariser& summariser, Transport& transport, const ProfilerRings& rings,
                const std::string& key, uint64_t now, bool announce = false) {
  DropCounts drops = drop_counts(bpf, summariser, transport, rings);
  const std::pair<uint64_t, uint64_t> id = transport.batch_id(key);
  const uint64_t instance = id.first, seq = id.second;
  const std::string clock_of = transport.route(key);
  summariser.set_layout(transport.reads_compact() ? proto::BlockLayout::table : proto::BlockLayout::columns);
  auto fill = [&](wire::Batch::Builder batch) {
    if (announce) {
      summariser.announce(batch, drops, key);
    } else {
      summariser.fill(batch, drops, key, clock_of);
      batch.setClockOf(clock_of);
    }
    batch.setPlacementKey(key);
  };
  transport.submit(instance, seq, proto::encode_batch(instance, seq, now, fill), key, announce);
}

// Every key with something to send (the one key "" without a fleet), a
// batch each; false when none had anything.
bool send_batches(NcclProbes& bpf, Summariser& summariser, Transport& transport, const ProfilerRings& rings,
                  uint64_t now) {
  summariser.set_keyed(transport.in_fleet());
  if (!transport.in_fleet()) {
    if (summariser.empty()) return false;
    send_batch(bpf, summariser, transport, rings, "", now);
    return true;
  }
  bool sent = false;
  const std::set<std::string> keys = summariser.keys();
  // A key placed elsewhere than where its processes were told of: told again first.
  for (const std::string& key : keys) transport.track(key);
  transport.forget_streams(keys);
  for (const std::string& key : transport.take_moved()) send_batch(bpf, summariser, transport, rings, key, now, true);
  for (const std::string& key : keys) {
    if (!summariser.pending(key, transport.route(key))) continue;
    send_batch(bpf, summariser, transport, rings, key, now);
    sent = true;
  }
  return sent;
}

// The heartbeat: traced processes, drops, each process's health and host
// context, open waits.
void send_heartbeat(NcclProbes& bpf, Summariser& summariser, Transport& transport, const ProfilerRings& rings,
                    CgroupReport& cgroups, const Options& options, uint64_t now) {
  DropCounts drops = drop_counts(bpf, summariser, transport, rings);
  const bool taken = transport.send_heartbeat([&](wire::Heartbeat::Builder hb) {
    hb.setTracedProcesses(static_cast<uint32_t>(summariser.traced_processes()));
    proto::write_drops(drops, hb.initDrops());
    summariser.health(hb, now, [&](uint32_t pid) { return bpf.host_stats(pid); });
    if (options.host_context) cgroups.fill(bpf.cgroup_stats(), hb);
    summariser.open_waits(bpf.open_waits(), hb);
    if (rings.counts().rings > 0) summariser.gpu_open(rings.open(), hb);
  });
  // The exits it told of are told again until a collector's connection
  // takes the heartbeat (how a rank ended, and its counters at exit, which
  // bill its last interval).
  if (taken) summariser.exits_reported();
}

// Waits up to a tick for the collector's replies, waking at once for them
// (a clock reply stamped late would look like a long round trip; records
// wait for the tick), and takes them. A welcome after the first (the
// collector restarted) sends every process's identity again. SIGTERM and
// SIGINT interrupt the poll (EINTR, which cppzmq throws): the loop then
// sees `stop` and shuts down cleanly instead of aborting.
// Returns whether a welcome came: a new connection's clock is probed at
// once (until its first probe the collector knows this node's clock only
// by its wall time, which may be seconds off).
bool take_replies(Transport& transport, Summariser& summariser, uint64_t& welcomes, uint64_t now) {
  std::vector<zmq::pollitem_t> items = transport.poll_items();
  try {
    zmq::poll(items, std::chrono::milliseconds(kTickMs));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
  transport.service();
  if (transport.welcomes() == welcomes) return false;
  welcomes = transport.welcomes();
  if (welcomes > 1) {
    summariser.resend_identities();
    summariser.relist_recent_exits(now);
  }
  return true;
}

// Whether NCCL's proxy steps are wanted now: during the first
// proxy_detail_ms of each period of the wall clock (every node's agent at
// once, within their clocks' agreement).
bool proxy_detail_wanted(const Options& options) {
  if (options.proxy_detail_ms == 0) return false;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint64_t ms = static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000;
  return ms % options.proxy_detail_period_ms < options.proxy_detail_ms;
}

// The rings of processes that may have one now (newly traced, or a new
// communicator: the plugin makes its ring at the first), looked for once
// each; not on a timer, which would list every descriptor of every traced
// process without the plugin, again and again.
void attach_rings(Summariser& summariser, ProfilerRings& rings) {
  for (const auto& [pid, start_time] : summariser.take_ring_candidates()) {
    const uint64_t before = rings.counts().rings;
    if (rings.attach(pid, start_time) && rings.counts().rings > before)
      RS_LOG(info, "reading the GPU side of process %u (NCCL profiler plugin)", pid);
  }
}

// A short grace for the last batches' acks; what is left is in the spool, or lost.
void await_last_acks(Transport& transport, const Options& options, const Clock& clock) {
  uint64_t deadline = clock.monotonic_ns() + 2000 * kMs;
  while (transport.unacked() > 0 && clock.monotonic_ns() < deadline) {
    transport.service();
    usleep(10000);
  }
  if (transport.unacked() > 0)
    RS_LOG(warn, "stopping with %zu batch(es) not acknowledged by %s%s", transport.unacked(), options.collector.c_str(),
           transport.spool() ? " (kept in the spool: the next start sends them)" : " (lost: no spool)");
}
}  // namespace

int run(const Options& options, const std::atomic<bool>& stop) {
  auto scope = resolve_scope(options);
  if (!scope) {
    RS_LOG(error, "%s", scope.error().message.c_str());
    return 2;
  }
  SystemClock system_clock;
  OffsetClock clock(system_clock, options.test_clock_offset_ns);
  auto now = [&] { return clock.monotonic_ns(); };

  Summariser summariser(options.proc_root, options.node, clock, options.container_state_root, options.slurm_jobs_dir);
  auto probes = NcclProbes::open(
      *scope,
      [&](const void* data, size_t size) {
        if (auto event = decode_event(data, size))
          summariser.on_event(*event);
        else
          summariser.on_malformed();
      },
      options.host_context, options.multi_uprobes);
  if (!probes) {
    RS_LOG(error, "%s", probes.error().message.c_str());
    return 3;
  }
  NcclProbes& bpf = **probes;

  Discovery discovery(options.proc_root);
  if (!attach_known_libraries(bpf, discovery, options)) return 2;
  auto spool = open_spool(options);
  if (!spool) return 2;

  zmq::context_t context(1);
  uint64_t instance = random_instance_id();
  Transport transport(
      context, options, clock, instance,
      [&](uint64_t t1, uint64_t t2, uint64_t t3, uint64_t t4, const std::string& collector) {
        summariser.add_clock_sample(t1, t2, t3, t4, collector);
      },
      std::move(*spool));
  RS_LOG(info, "node %s: tracing %s, sending to %s", options.node.c_str(), scope->describe().c_str(),
         options.collector.c_str());

  CgroupReport cgroups(cgroup2_mount());
  // The second source: the GPU side of collectives, from the rings of
  // traced processes that loaded rankscope's NCCL profiler plugin.
  ProfilerRings rings(options.proc_root);
  auto gpu = [&](const GpuCollective& c) { summariser.on_gpu(c); };
  uint64_t last_scan = 0, last_flush = now(), last_heartbeat = 0, last_probe = 0;
  uint64_t welcomes = 0;
  // The collector renews its request for proxy steps with each heartbeat's
  // reply; a few heartbeats without one, and they go off.
  const uint64_t detail_lease_ns = std::max<uint64_t>(5ull * options.heartbeat_interval_ms, 5'000) * kMs;
  while (!stop.load()) {
    if (take_replies(transport, summariser, welcomes, now())) last_probe = 0;
    // A job whose collector changed: its processes and communicators are
    // announced to the new one before its batches not yet acknowledged.
    summariser.set_keyed(transport.in_fleet());
    for (const std::string& key : transport.take_moved())
      send_batch(bpf, summariser, transport, rings, key, now(), true);
    bpf.consume();
    attach_rings(summariser, rings);
    rings.set_detail(proxy_detail_wanted(options), transport.detail_comms(detail_lease_ns));
    rings.drain(gpu);
    uint64_t t = now();
    if (t - last_scan >= options.scan_interval_ms * kMs) {
      for (const auto& library : discovery.scan(*scope)) attach_library(bpf, discovery, library, options);
      bpf.consume();  // exit events of processes about to be found gone
      for (uint32_t pid : summariser.forget_exited()) rings.detach(pid, gpu);
      last_scan = t;
    }
    if (t - last_probe >= options.clock_probe_interval_ms * kMs) {
      transport.send_clock_probe();
      last_probe = t;
    }
    if (t - last_flush >= options.batch_interval_ms * kMs && !summariser.empty()) {
      send_batches(bpf, summariser, transport, rings, t);
      for (int more = 0; more < kMoreBatches && summariser.pending_records() >= kMoreBatchesAt &&
                         transport.memory_bytes() < options.max_unacked_bytes / 2;
           ++more)
        send_batches(bpf, summariser, transport, rings, t);
      last_flush = t;
    } else if (summariser.empty()) {
      last_flush = t;  // the age of a batch counts from its first record
    }
    if (t - last_heartbeat >= options.heartbeat_interval_ms * kMs) {
      send_heartbeat(bpf, summariser, transport, rings, cgroups, options, t);
      last_heartbeat = t;
    }
  }

  // Last records out, several batches if one cannot carry it all.
  bpf.poll(0);
  rings.drain(gpu);
  // (Each round takes what one batch per key can carry: the bound is only a guard.)
  for (int round = 0; round < 100'000 && send_batches(bpf, summariser, transport, rings, now()); ++round) {
  }
  await_last_acks(transport, options, clock);
  RS_LOG(info, "stopped");
  return 0;
}

}  // namespace rankscope::agent
