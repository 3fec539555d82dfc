#pragma once
// The simulated agents' clock probes, where their collector answers probes
// on a socket of its own (HelloReply.clockPort), sent and read on a thread
// of their own.
//
// One simulator process speaks for hundreds of nodes. Its main loop builds
// their batches, and it would read a probe's reply only between its
// ticks: late, which reads as a long way back, and biases every node's
// offset by the simulator's own load. A real node's agent has a loop of
// its own. Here each node's probe leaves every second, stamped when it
// really leaves; its reply is stamped when it is really read. The node's
// clock (NodeDef::clock_at) and the simulated network's jitter apply as in
// SimAgent. Sockets are in a ZeroMQ context of their own, so its I/O
// thread carries no batch.
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "tools/sim/model.h"

namespace rankscope::sim {

class ClockProber {
 public:
  struct Answer {
    std::array<uint64_t, 4> sample;  // t1, t2, t3, t4
    int64_t in_ns = 0, out_ns = 0;   // its real delays on this machine, in and out
  };
  // `t0_real`: the run's start (CLOCK_REALTIME); `jitter_ms`: the
  // simulated network's mean extra round trip; `nodes`: how many at most.
  ClockProber(uint64_t t0_real, double jitter_ms, size_t nodes);
  ~ClockProber();
  ClockProber(const ClockProber&) = delete;
  ClockProber& operator=(const ClockProber&) = delete;

  // Node `node` (its clock `def`, which must outlive the prober) probes
  // `endpoint` from now on: at once, then every second. Again with
  // another endpoint: re-opened; with the same: nothing.
  void open(int node, const NodeDef& def, const std::string& endpoint, uint64_t seed);
  // Its agent died: no more probes.
  void close(int node);
  // The probes answered since the last call.
  std::vector<Answer> take(int node);

 private:
  struct Node {
    const NodeDef* def = nullptr;
    std::string endpoint;
    std::unique_ptr<zmq::socket_t> socket;
    std::mt19937_64 rng;
    int64_t next_ns = 0;  // true time (rel) of the next probe; 0: at once
    struct InFlight {
      int64_t back = 0;
      uint64_t sent_real = 0;
    };
    std::map<uint64_t, InFlight> in_flight;  // by t1
  };
  struct Request {
    int node;
    const NodeDef* def;
    std::string endpoint;  // empty: close
    uint64_t seed;
  };
  void loop();
  void apply_requests();
  void probe(Node& node, int64_t rel_ns);
  void read(int index, Node& node);
  int64_t now_rel() const;

  uint64_t t0_real_;
  double jitter_ms_;
  zmq::context_t context_{1};
  mutable std::mutex mutex_;
  std::vector<Request> requests_;             // under mutex_
  std::map<int, Node> nodes_;                       // the thread's alone
  std::map<int, std::vector<Answer>> answered_;     // not taken yet (under mutex_)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace rankscope::sim
