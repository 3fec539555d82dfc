#pragma once
// One simulated node agent: its own ZeroMQ DEALER connection to the
// collector, speaking the agent protocol the way node-agent/transport.cpp
// and node-agent/summarise.cpp do: Hello first (again on needHello), clock
// probes every second, a batch at most 100 ms after its first record, kept
// until acked and re-sent after the ack timeout, a heartbeat every second
// with the processes' health and the waits still open. Its clock is the
// node's simulated one (true time, its own origin and drift), and its
// probes see simulated network jitter.
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "common/ack_timer.h"
#include "proto/codec.h"
#include "tools/sim/model.h"
#include "tools/sim/prober.h"

namespace rankscope::sim {

namespace wire = ::rankscope::proto::wire;

struct AgentCounters {
  uint64_t batches = 0, records = 0, records_lost = 0, sends_lost = 0, reordered = 0, resent = 0;
  uint64_t acked = 0, records_acked = 0, probes = 0, heartbeats = 0, hellos = 0;
  uint64_t wire_bytes = 0;  // first sends of batches
  // Each answered probe's real delays on this machine, without the simulated
  // network's: to the collector's t2, and from its t3 to the reply's reading.
  std::vector<int64_t> probe_in_ns, probe_out_ns;
};

class SimAgent {
 public:
  // `t0_real` is the true (collector machine) realtime of the run's start.
  // `prober`: where its collector answers clock probes apart
  // (HelloReply.clockPort), the prober's thread sends and reads them, as a
  // real agent's own loop would (tools/sim/prober.h); null, or a
  // collector that says no port: on its connection, from its ticks.
  SimAgent(zmq::context_t& context, const std::string& endpoint, const Fleet& fleet, int node, uint64_t t0_real,
           uint64_t seed, ClockProber* prober = nullptr);

  void add_events(std::vector<SimEvent>& events);
  // Does what is due at true time `rel_ns` (relative to the run's start).
  void tick(int64_t rel_ns);
  // Reads every reply waiting.
  void service(int64_t rel_ns);
  zmq::socket_t& socket() { return socket_; }
  bool dead() const { return dead_; }
  // A clock probe's reply is still to come: the run loop reads such sockets
  // between the fleet's ticks, so that the reply is stamped when it came.
  bool awaiting_probe() const { return accepted_ && !dead_ && !probe_in_flight_.empty(); }
  bool accepted() const { return accepted_; }
  // How the host blocks are written (proto/codec.h), a table's batches
  // compressed: columns until the collector says it reads both
  // (readsCompact), as the agent does; set it to build batches before
  // connecting (the flood).
  void set_layout(proto::BlockLayout layout) { layout_ = layout; }
  size_t unacked() const { return queue_.size(); }
  const AgentCounters& counters() const { return counters_; }
  // Sends what is pending now (the end of a run).
  void flush_now(int64_t rel_ns);
  // Re-sends the batches whose ack is overdue (tick does it too; at the end
  // of a run, when the simulated time no longer advances, only this).
  void resend_due(int64_t rel_ns);

  // For the flood: every event given so far, cut into batches of `window_ns`
  // of true time, encoded now (records, bytes) to be sent later in order.
  std::vector<std::pair<size_t, std::string>> prebuild(int64_t window_ns);
  void start(int64_t rel_ns);
  // Queues and sends one prebuilt batch (numbered 1, 2, ... in submit order).
  void submit(std::string bytes, int64_t rel_ns);

 private:
  struct Pending {
    uint64_t seq;
    std::string bytes;
    int64_t last_sent = -1;  // true rel ns; -1 never
    size_t records = 0;
    int resends = 0;  // as the agent: the wait for an ack doubles with each re-send
  };
  struct BlockKey {
    uint32_t pid;
    uint64_t comm;
    uint32_t lane;
    bool operator<(const BlockKey& o) const { return std::tie(pid, comm, lane) < std::tie(o.pid, o.comm, o.lane); }
  };

  uint64_t node_clock(int64_t rel_ns) const { return node_.clock_at(rel_ns); }
  // True time now. A probe is stamped when it really leaves and its reply
  // when it is really read, as an agent does: the loop's tick time is up to
  // one pass over the whole fleet old, and at 1,024 nodes that skewed the
  // probes (and the collector's offsets) by milliseconds.
  int64_t now_rel() const;
  void send(const std::string& bytes);
  void send_hello(int64_t rel_ns);
  void send_probe();
  void send_heartbeat(int64_t rel_ns);
  void fill_heartbeat(wire::Heartbeat::Builder hb, int64_t rel_ns);
  void flush(int64_t rel_ns);
  std::string build_batch(int64_t rel_ns);
  // The batch's content: the first announces the processes and communicators.
  void fill_batch(wire::Batch::Builder batch);
  void announce(wire::Batch::Builder batch);
  void take_due(int64_t rel_ns);
  void transmit(Pending& p, int64_t rel_ns, bool first);
  void handle(const std::string& bytes, int64_t rel_ns);

  const Fleet& fleet_;
  int index_;
  const NodeDef& node_;
  uint64_t t0_real_;
  std::mt19937_64 rng_;
  zmq::socket_t socket_;
  ClockProber* prober_;
  std::string endpoint_;
  bool probes_apart_ = false;  // the prober has them
  // Where its collector answers probes apart, said in its HelloReply.
  void take_clock_port(uint16_t port);
  bool accepted_ = false, dead_ = false, announced_ = false;
  proto::BlockLayout layout_ = proto::BlockLayout::columns;
  int64_t last_hello_ = -1, last_probe_ = -1, last_heartbeat_ = -1, batch_opened_ = -1;
  uint64_t batch_seq_ = 0;
  uint64_t submitted_seq_ = 0;
  std::priority_queue<SimEvent, std::vector<SimEvent>, std::greater<SimEvent>> future_;
  std::map<BlockKey, proto::ColumnBlock> blocks_;
  std::map<uint32_t, proto::WaitBlock> waits_;
  std::vector<std::array<uint64_t, 4>> samples_;
  struct ProbeInFlight {
    int64_t back = 0;        // the simulated network's delay on the way back, added at receipt
    uint64_t sent_real = 0;  // when it really left (CLOCK_REALTIME, the collector's clock on this machine)
  };
  std::map<uint64_t, ProbeInFlight> probe_in_flight_;  // by t1
  size_t pending_records_ = 0;
  uint64_t ringbuf_lost_ = 0;
  std::deque<Pending> queue_;
  // Batches prebuilt and not submitted yet: made, so its heartbeats count
  // them as unacknowledged (as an agent's spool), and the collector does
  // not take the node as having told it everything it captured.
  size_t prebuilt_ = 0;
  uint64_t held_seq_ = 0;  // a batch held back, to be sent after the next one (reordering)
  AckTimer ack_timer_;     // when to re-send, as the agent (node-agent/transport.cpp) decides it
  std::set<uint32_t> reported_dead_;
  std::map<uint32_t, uint64_t> cpu_ns_;  // per pid, simulated main-thread CPU time
  int64_t last_cpu_sample_ = 0;
  AgentCounters counters_;
};

}  // namespace rankscope::sim
