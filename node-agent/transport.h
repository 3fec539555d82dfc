#pragma once
// The agent's side of the wire: one ZeroMQ DEALER socket to the collector.
// Hello first; then batches, each kept until the collector acknowledges that
// it is durably stored, re-sent when no ack came in time (a collector that
// restarted, a network that dropped). Never blocks the caller.
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <zmq.hpp>

#include "common/clock.h"
#include "node-agent/options.h"
#include "proto/agent.capnp.h"

namespace rankscope::agent {

namespace wire = ::rankscope::proto::wire;

class Transport {
 public:
  using ClockSampleSink = std::function<void(uint64_t t1, uint64_t t2, uint64_t t3, uint64_t t4)>;

  Transport(zmq::context_t& context, const Options& options, const Clock& clock, uint64_t instance_id,
            ClockSampleSink on_clock_sample);

  // Takes a serialised batch; it stays queued until acked.
  void submit(uint64_t seq, std::string bytes);
  // Reads every reply waiting, re-sends what is due. Never waits.
  void service();
  void send_clock_probe();
  // `fill` adds what the caller knows (drops, process health) to the heartbeat.
  void send_heartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill);

  bool accepted() const { return accepted_; }
  size_t unacked() const { return queue_.size(); }
  uint64_t discarded_batches() const { return discarded_; }
  zmq::socket_t& socket() { return socket_; }

 private:
  struct Pending {
    uint64_t seq;
    std::string bytes;
    uint64_t last_sent_ns = 0;  // 0: never sent
  };
  uint64_t now() const { return clock_.monotonic_ns() + static_cast<uint64_t>(options_.test_clock_offset_ns); }
  bool send_bytes(const std::string& bytes);
  void send_hello();
  void handle(const std::string& bytes);
  void resend_due();
  void warn_if_unanswered();

  const Options& options_;
  const Clock& clock_;
  uint64_t instance_id_;
  ClockSampleSink on_clock_sample_;
  zmq::socket_t socket_;
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  bool accepted_ = false;
  uint64_t last_hello_ns_ = 0;
  uint64_t discarded_ = 0;
  uint64_t last_refusal_log_ns_ = 0;
  uint64_t waiting_since_ns_ = 0;     // no reply yet since then (0: a reply came)
  uint64_t last_silence_log_ns_ = 0;
  uint64_t last_reconnect_ns_ = 0;
};

// Reads /proc/sys/kernel/random/boot_id (empty if unreadable).
std::string boot_id();

}  // namespace rankscope::agent
