#include "tools/sim/agent.h"

#include <algorithm>

#include "common/clock.h"
#include "common/log.h"
#include "common/version.h"
#include "proto/agent_wire.h"

namespace rankscope::sim {

namespace {
// The agent's defaults (node-agent/options.h).
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kBatchInterval = 100 * kMs;
constexpr int64_t kHeartbeatInterval = 1000 * kMs;
constexpr int64_t kProbeInterval = 1000 * kMs;
constexpr int64_t kAckTimeout = 2000 * kMs;
constexpr int64_t kMaxAckWait = 60'000 * kMs;
constexpr int64_t kHelloRetry = 2000 * kMs;
}  // namespace

SimAgent::SimAgent(zmq::context_t& context, const std::string& endpoint, const Fleet& fleet, int node, uint64_t t0_real,
                   uint64_t seed, ClockProber* prober)
    : fleet_(fleet),
      index_(node),
      node_(fleet.nodes()[node]),
      t0_real_(t0_real),
      rng_(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(node) * 104729ull + 3),
      socket_(context, zmq::socket_type::dealer),
      prober_(prober),
      endpoint_(endpoint),
      ack_timer_(kAckTimeout, kMaxAckWait) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::immediate, 1);
  socket_.set(zmq::sockopt::sndhwm, 1000);
  socket_.set(zmq::sockopt::reconnect_ivl, 100);
  socket_.connect(endpoint);
  // Probes start at different moments on different nodes, as agents started apart do.
  last_probe_ = -static_cast<int64_t>(rng_() % static_cast<uint64_t>(kProbeInterval));
  last_heartbeat_ = -static_cast<int64_t>(rng_() % static_cast<uint64_t>(kHeartbeatInterval));
}

void SimAgent::send(const std::string& bytes) {
  try {
    (void)socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    RS_LOG(warn, "node %s: send failed: %s", node_.name.c_str(), e.what());
  }
}

void SimAgent::send_hello(int64_t rel_ns) {
  proto::Hello hello;
  hello.node = node_.name;
  hello.instance_id = node_.instance;
  hello.boot_id = "sim-boot-" + std::to_string(node_.instance);
  hello.agent_version = std::string("rankscope-sim ") + kVersion;
  hello.kernel_release = "sim";
  hello.monotonic_ns = node_clock(rel_ns);
  hello.realtime_ns = static_cast<uint64_t>(static_cast<int64_t>(t0_real_) + rel_ns + node_.wall_skew_ns);
  send(proto::encode_hello(hello));
  last_hello_ = rel_ns;
  ++counters_.hellos;
}

int64_t SimAgent::now_rel() const { return static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0_real_); }

void SimAgent::send_probe() {
  // Network jitter on the way out: as if the probe had left earlier than it
  // did (t1 stamped before a delay); the way back is added at receipt.
  double mean = fleet_.config().probe_jitter_ms * 1e6 / 2;
  std::exponential_distribution<double> jitter(mean > 0 ? 1.0 / mean : 1e9);
  int64_t out = mean > 0 ? static_cast<int64_t>(jitter(rng_)) : 0;
  int64_t back = mean > 0 ? static_cast<int64_t>(jitter(rng_)) : 0;
  uint64_t t1 = node_clock(now_rel() - out);
  probe_in_flight_[t1] = ProbeInFlight{back, SystemClock::read(CLOCK_REALTIME)};
  while (probe_in_flight_.size() > 16) probe_in_flight_.erase(probe_in_flight_.begin());
  send(proto::encode_clock_probe(t1));
  ++counters_.probes;
}

void SimAgent::send_heartbeat(int64_t rel_ns) {
  proto::HeartbeatHeader header{node_.instance, node_clock(rel_ns), static_cast<uint32_t>(queue_.size() + prebuilt_)};
  send(proto::encode_heartbeat(header, [&](wire::Heartbeat::Builder hb) { fill_heartbeat(hb, rel_ns); }));
  ++counters_.heartbeats;
}

void SimAgent::fill_heartbeat(wire::Heartbeat::Builder hb, int64_t rel_ns) {
  const JobDef& job = fleet_.jobs()[node_.job];
  hb.setTracedProcesses(static_cast<uint32_t>(node_.ranks.size() - reported_dead_.size()));
  auto drops = hb.initDrops();
  drops.setRingbufFull(ringbuf_lost_);
  std::vector<int> listed, waiting;
  for (int r : node_.ranks) {
    const RankState& st = fleet_.rank_state(node_.job, r);
    if (st.killed && rel_ns >= st.since_ns && reported_dead_.count(job.ranks[r].pid)) continue;
    listed.push_back(r);
    bool stopped = st.stopped && rel_ns >= st.since_ns;
    bool killed = st.killed && rel_ns >= st.since_ns;
    if (!stopped && !killed && rel_ns >= st.blocked_at) waiting.push_back(r);
  }
  auto processes = hb.initProcesses(static_cast<unsigned>(listed.size()));
  double elapsed = static_cast<double>(rel_ns - last_cpu_sample_);
  for (unsigned i = 0; i < listed.size(); ++i) {
    int r = listed[i];
    const RankState& st = fleet_.rank_state(node_.job, r);
    uint32_t pid = job.ranks[r].pid;
    auto p = processes[i];
    p.setPid(pid);
    p.setSampleNs(node_clock(rel_ns));
    bool killed = st.killed && rel_ns >= st.since_ns;
    bool stopped = st.stopped && rel_ns >= st.since_ns;
    bool blocked = rel_ns >= st.blocked_at;
    if (killed) {
      p.setAlive(false);
      p.setExitSignal(9);
      reported_dead_.insert(pid);
      continue;
    }
    p.setAlive(true);
    p.setState(static_cast<uint8_t>(stopped ? 'T' : blocked ? 'S' : 'R'));
    // A working rank's main thread runs most of the time; a stopped or
    // blocked one hardly at all.
    cpu_ns_[pid] += static_cast<uint64_t>(elapsed * (stopped || blocked ? 0.01 : 0.6));
    p.setCpuNs(cpu_ns_[pid]);
    p.setRunqueueNs(cpu_ns_[pid] / 50);
  }
  last_cpu_sample_ = rel_ns;
  auto open = hb.initOpenWaits(static_cast<unsigned>(waiting.size()));
  for (unsigned i = 0; i < waiting.size(); ++i) {
    const RankState& st = fleet_.rank_state(node_.job, waiting[i]);
    uint32_t pid = job.ranks[waiting[i]].pid;
    open[i].setPid(pid);
    open[i].setTid(pid);
    open[i].setKind(wire::WaitKind::STREAM_SYNCHRONIZE);
    open[i].setStartNs(node_clock(st.blocked_at));
  }
}

void SimAgent::add_events(std::vector<SimEvent>& events) {
  for (auto& e : events) future_.push(e);
  events.clear();
}

void SimAgent::flush(int64_t rel_ns) {
  size_t records = pending_records_;
  std::string bytes = build_batch(rel_ns);
  queue_.push_back(Pending{batch_seq_, std::move(bytes), -1, records});
  Pending& p = queue_.back();
  counters_.wire_bytes += p.bytes.size();
  std::uniform_real_distribution<double> unit(0, 1);
  if (held_seq_ == 0 && unit(rng_) < fleet_.config().batch_reorder) {
    held_seq_ = p.seq;  // sent after the next one
    p.last_sent = rel_ns;
    ++counters_.reordered;
    return;
  }
  transmit(p, rel_ns, true);
  if (held_seq_ != 0) {
    for (auto& q : queue_)
      if (q.seq == held_seq_) transmit(q, rel_ns, true);
    held_seq_ = 0;
  }
}

std::string SimAgent::build_batch(int64_t rel_ns) {
  std::string bytes = proto::encode_batch(node_.instance, ++batch_seq_, node_clock(rel_ns),
                                          [&](wire::Batch::Builder batch) { fill_batch(batch); });
  if (layout_ == proto::BlockLayout::table) bytes = proto::encode_compact(bytes);  // as the agent sends it
  counters_.records += pending_records_;
  ++counters_.batches;
  blocks_.clear();
  waits_.clear();
  samples_.clear();
  pending_records_ = 0;
  batch_opened_ = -1;
  return bytes;
}

void SimAgent::announce(wire::Batch::Builder batch) {
  const JobDef& job = fleet_.jobs()[node_.job];
  std::vector<proto::ProcessIdentity> processes;
  std::vector<proto::CommJoined> comms;
  for (int r : node_.ranks) {
    const RankDef& rd = job.ranks[r];
    proto::ProcessIdentity& p = processes.emplace_back();
    p.pid = rd.pid;
    p.start_time = 1000 + rd.pid;
    p.exe = "/usr/bin/python3";
    p.job = job.name;
    p.rank = r;
    p.local_rank = rd.local;
    p.world_size = static_cast<int32_t>(job.ranks.size());
    // Tenants as a shared cluster has them: each job one of ten accounts
    // and of 25 users (what reports --by account / user group).
    p.uid = 1000 + static_cast<uint32_t>(node_.job % 25);
    p.user = "user-" + std::to_string(node_.job % 25);
    p.account = fleet_.config().prefix + "-account-" + std::to_string(node_.job % 10);
    p.visible_devices = std::to_string(rd.local);
    for (int c : {rd.tp, rd.dp, rd.pp, job.world})
      if (c >= 0) {
        const CommDef& comm = job.comms[c];
        proto::CommJoined& joined = comms.emplace_back();
        joined.pid = rd.pid;
        joined.hash = comm.hash;
        joined.handle = 0x7f0000000000ull + comm.hash % 0xffffff;
        joined.rank =
            static_cast<int32_t>(std::find(comm.members.begin(), comm.members.end(), r) - comm.members.begin());
        joined.nranks = static_cast<int32_t>(comm.members.size());
        joined.origin = wire::CommOrigin::INIT_RANK;
        joined.entry_ns = joined.return_ns = node_clock(0);
      }
  }
  std::vector<const proto::ProcessIdentity*> listed;
  for (const auto& p : processes) listed.push_back(&p);
  proto::write_processes(listed, batch);
  proto::write_comms(comms, batch);
}

void SimAgent::fill_batch(wire::Batch::Builder batch) {
  if (!announced_) {
    // Processes and communicators, once, in the first batch (as the agent
    // sends them when it first sees them).
    announce(batch);
    announced_ = true;
  }
  std::vector<const proto::ColumnBlock*> blocks;
  for (const auto& [key, block] : blocks_) blocks.push_back(&block);
  proto::encode_collectives(blocks, batch, {}, layout_);
  std::vector<proto::WaitBlock> waits;
  for (auto& [pid, block] : waits_) waits.push_back(std::move(block));
  proto::encode_waits(waits, batch);
  proto::write_clock_samples(samples_, batch);
  batch.initDrops().setRingbufFull(ringbuf_lost_);
}

void SimAgent::take_due(int64_t rel_ns) {
  std::uniform_real_distribution<double> unit(0, 1);
  while (!future_.empty() && future_.top().at_ns <= rel_ns) {
    const SimEvent& e = future_.top();
    if (batch_opened_ < 0) batch_opened_ = rel_ns;
    if (e.wait) {
      auto& block = waits_[e.pid];
      block.pid = e.pid;
      block.tid = e.pid;
      block.waits.push_back(proto::WaitRecord{static_cast<uint8_t>(wire::WaitKind::STREAM_SYNCHRONIZE), 0,
                                              node_clock(e.wait_start), node_clock(e.wait_end), 0});
    } else if (unit(rng_) < fleet_.config().record_loss) {
      ++ringbuf_lost_;  // the ring buffer was full: a gap in the sequence numbers
      ++counters_.records_lost;
    } else {
      auto& block = blocks_[BlockKey{e.pid, e.comm, e.lane}];
      if (block.records.empty()) {
        block.pid = e.pid;
        block.comm_hash = e.comm;
        block.rank = e.comm_rank;
        block.lane = e.lane;
      }
      proto::CallRecord call = e.call;
      call.issue_ns = node_clock(static_cast<int64_t>(e.call.issue_ns));
      call.return_ns = node_clock(static_cast<int64_t>(e.call.return_ns));
      block.records.push_back(call);
      ++pending_records_;
    }
    future_.pop();
  }
}

std::vector<std::pair<size_t, std::string>> SimAgent::prebuild(int64_t window_ns) {
  std::vector<std::pair<size_t, std::string>> out;
  while (!future_.empty()) {
    int64_t until = (future_.top().at_ns / window_ns + 1) * window_ns;
    take_due(until - 1);
    size_t records = pending_records_;
    out.emplace_back(records, build_batch(until));
  }
  prebuilt_ += out.size();
  return out;
}

void SimAgent::start(int64_t rel_ns) { send_hello(rel_ns); }

void SimAgent::submit(std::string bytes, int64_t rel_ns) {
  if (prebuilt_ > 0) --prebuilt_;
  queue_.push_back(Pending{++submitted_seq_, std::move(bytes)});
  transmit(queue_.back(), rel_ns, false);
}

void SimAgent::transmit(Pending& p, int64_t rel_ns, bool first) {
  bool resend = !first && p.last_sent >= 0;
  p.last_sent = rel_ns;
  if (!accepted_) return;
  std::uniform_real_distribution<double> unit(0, 1);
  if (first && unit(rng_) < fleet_.config().batch_loss) {
    ++counters_.sends_lost;  // lost on the way: the ack timeout brings it back
    return;
  }
  if (resend) ++counters_.resent;
  send(p.bytes);
}

void SimAgent::tick(int64_t rel_ns) {
  if (dead_) return;
  if (fleet_.agent_dead(index_, rel_ns)) {
    // The agent dies: the connection goes silent, nothing more is sent.
    dead_ = true;
    socket_.close();
    if (probes_apart_) prober_->close(index_);
    return;
  }
  if (!accepted_ && (last_hello_ < 0 || rel_ns - last_hello_ > kHelloRetry)) send_hello(rel_ns);
  take_due(rel_ns);
  if (probes_apart_) {
    for (const ClockProber::Answer& a : prober_->take(index_)) {
      samples_.push_back(a.sample);
      counters_.probe_in_ns.push_back(a.in_ns);
      counters_.probe_out_ns.push_back(a.out_ns);
      ++counters_.probes;
      if (batch_opened_ < 0) batch_opened_ = rel_ns;
    }
  } else if (accepted_ && rel_ns - last_probe_ >= kProbeInterval) {
    send_probe();
    last_probe_ = rel_ns;
  }
  if (batch_opened_ >= 0 && rel_ns - batch_opened_ >= kBatchInterval) flush(rel_ns);
  if (accepted_ && rel_ns - last_heartbeat_ >= kHeartbeatInterval) {
    send_heartbeat(rel_ns);
    last_heartbeat_ = rel_ns;
  }
  resend_due(rel_ns);
}

void SimAgent::resend_due(int64_t rel_ns) {
  if (dead_ || !accepted_) return;
  for (auto& p : queue_)
    if (p.seq != held_seq_ && p.last_sent >= 0 &&
        rel_ns - p.last_sent >= static_cast<int64_t>(ack_timer_.wait_ns(static_cast<uint32_t>(p.resends)))) {
      ++p.resends;
      transmit(p, rel_ns, false);
    }
}

void SimAgent::flush_now(int64_t rel_ns) {
  if (dead_) return;
  if (batch_opened_ >= 0) flush(rel_ns);
  if (held_seq_ != 0) {
    for (auto& q : queue_)
      if (q.seq == held_seq_) transmit(q, rel_ns, true);
    held_seq_ = 0;
  }
}

void SimAgent::take_clock_port(uint16_t port) {
  const std::string endpoint = proto::clock_probe_endpoint(endpoint_, port);
  const bool reachable = !endpoint.empty();
  if (!prober_ || (!reachable && !probes_apart_)) return;
  if (reachable) {
    prober_->open(index_, node_, endpoint, rng_());
  } else {
    prober_->close(index_);
  }
  probes_apart_ = reachable;
}

void SimAgent::service(int64_t rel_ns) {
  if (dead_) return;
  for (;;) {
    zmq::message_t reply;
    zmq::recv_result_t got;
    try {
      got = socket_.recv(reply, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      break;
    }
    if (!got) break;
    handle(std::string(static_cast<const char*>(reply.data()), reply.size()), rel_ns);
  }
}

void SimAgent::handle(const std::string& bytes, int64_t rel_ns) {
  auto result = proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto message) {
    switch (message.which()) {
      case wire::CollectorMessage::HELLO_REPLY:
        if (message.getHelloReply().getAccepted()) {
          accepted_ = true;
          layout_ = message.getHelloReply().getReadsCompact() ? proto::BlockLayout::table : proto::BlockLayout::columns;
          take_clock_port(message.getHelloReply().getClockPort());
          ack_timer_.reset();
          // As the agent: a new connection's clock is probed at once (by
          // the prober, at once, where it has them).
          if (!probes_apart_) send_probe();
          for (auto& p : queue_) {
            p.last_sent = -1;
            p.resends = 0;
          }
          for (auto& p : queue_) transmit(p, rel_ns, false);
        } else {
          RS_LOG(error, "collector refused node %s: %s", node_.name.c_str(),
                 message.getHelloReply().getReason().cStr());
        }
        break;
      case wire::CollectorMessage::ACK: {
        auto ack = message.getAck();
        if (ack.getInstanceId() != node_.instance) break;
        auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) { return p.seq == ack.getSeq(); });
        if (it != queue_.end()) {
          if (it->resends == 0 && it->last_sent >= 0 && rel_ns > it->last_sent)
            ack_timer_.sample(static_cast<uint64_t>(rel_ns - it->last_sent));
          counters_.records_acked += it->records;
          queue_.erase(it);
          ++counters_.acked;
        }
        break;
      }
      case wire::CollectorMessage::CLOCK_REPLY: {
        auto reply = message.getClockReply();
        auto probe = probe_in_flight_.find(reply.getT1());
        if (probe == probe_in_flight_.end()) break;
        uint64_t t4 = node_clock(now_rel() + probe->second.back);
        const uint64_t now_real = SystemClock::read(CLOCK_REALTIME);
        counters_.probe_in_ns.push_back(static_cast<int64_t>(reply.getT2() - probe->second.sent_real));
        counters_.probe_out_ns.push_back(static_cast<int64_t>(now_real - reply.getT3()));
        probe_in_flight_.erase(probe);
        samples_.push_back({reply.getT1(), reply.getT2(), reply.getT3(), t4});
        if (batch_opened_ < 0) batch_opened_ = rel_ns;
        break;
      }
      case wire::CollectorMessage::ERROR:
        if (message.getError().getCode() == wire::ErrorCode::NEED_HELLO) {
          accepted_ = false;
          send_hello(rel_ns);
        } else {
          RS_LOG(warn, "node %s: collector says %s", node_.name.c_str(), message.getError().getMessage().cStr());
        }
        break;
      default: break;
    }
  });
  if (!result) RS_LOG(warn, "node %s: bad reply: %s", node_.name.c_str(), result.error().message.c_str());
}

}  // namespace rankscope::sim
