#pragma once
// The agent's side of the wire: one ZeroMQ DEALER socket to the collector.
// Hello first; then batches, each kept until the collector acknowledges that
// it is durably stored, re-sent when no ack came in time (a collector that
// restarted, a network that dropped). Never blocks the caller.
//
// With a spool (node-agent/spool.h) every batch is on disk until acked and
// memory keeps only the newest `max_unacked_bytes` of them; the batches an
// earlier run left unacknowledged are sent first, with their own instance id
// and seq. When the spool is full its oldest segment goes: the batches in it
// keep their summaries (processes, communicators, clock samples) in memory
// and lose their records, which are counted (sendQueueFull, lostRecords).
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "common/ack_timer.h"
#include "common/clock.h"
#include "node-agent/options.h"
#include "node-agent/spool.h"
#include "proto/agent.capnp.h"

namespace rankscope::agent {

namespace wire = ::rankscope::proto::wire;

class Transport {
 public:
  using ClockSampleSink = std::function<void(uint64_t t1, uint64_t t2, uint64_t t3, uint64_t t4)>;

  // `spool` may be null: unacked batches are then kept in memory only.
  Transport(zmq::context_t& context, const Options& options, const Clock& clock, uint64_t instance_id,
            ClockSampleSink on_clock_sample, std::unique_ptr<Spool> spool = nullptr);

  // Takes a serialised batch; it stays queued (and spooled) until acked.
  void submit(uint64_t seq, std::string bytes);
  // Reads every reply waiting, re-sends what is due. Never waits.
  void service();
  void send_clock_probe();
  // `fill` adds what the caller knows (drops, process health) to the heartbeat.
  void send_heartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill);

  bool accepted() const { return accepted_; }
  // How many times a collector has accepted this agent's Hello: a change
  // means a new collector run (or connection), which may not know what the
  // agent told the last one.
  uint64_t welcomes() const { return welcomes_; }
  size_t unacked() const { return queue_.size(); }
  // Messages sent to and received from the collector so far (all kinds).
  uint64_t messages_sent() const { return messages_sent_; }
  uint64_t messages_received() const { return messages_received_; }
  uint64_t discarded_batches() const { return discarded_; }
  uint64_t lost_records() const { return lost_records_; }
  uint64_t spool_damaged() const { return spool_ ? spool_->damage().bad_tails : 0; }
  uint64_t memory_bytes() const { return queued_bytes_; }
  // How long a batch sent once now waits for its ack (common/ack_timer.h).
  uint64_t ack_timeout_ns() const { return ack_timer_.timeout_ns(); }
  const Spool* spool() const { return spool_.get(); }
  zmq::socket_t& socket() { return socket_; }
  // The communicators whose NCCL proxy steps the collector wants now
  // (its last DetailRequest), until `lease_ns` passes without another: a
  // collector that stopped asking, or died, does not leave them on.
  std::vector<uint64_t> detail_comms(uint64_t lease_ns) const;
  static constexpr size_t kMaxDetailComms = 4096;  // more in a request are not kept

 private:
  struct Pending {
    uint64_t instance;
    uint64_t seq;
    std::string bytes;          // empty: only on disk (read back to send)
    SpoolRef ref;               // segment 0: not on disk
    uint64_t last_sent_ns = 0;  // 0: never sent
    uint32_t resends = 0;       // sent again for want of an ack (the wait doubles each time)
    bool stripped = false;      // its records were dropped (counted once)
  };
  uint64_t now() const { return clock_.monotonic_ns(); }
  bool send_bytes(const std::string& bytes);
  void send_hello();
  void handle(const std::string& bytes);
  void resend_due();
  // How long to wait for the ack of a batch sent `resends` times already.
  uint64_t ack_wait_ns(const Pending& pending) const;
  // Sends one pending batch (reading it from the spool if needed).
  bool send_pending(Pending& pending);
  // Keeps memory and the spool within their bounds, counting what is lost.
  void enforce_bounds();
  // The batch's records go, its summaries stay (both counted).
  void drop_detail(Pending& pending);
  void warn_if_unanswered();

  const Options& options_;
  const Clock& clock_;
  uint64_t instance_id_;
  ClockSampleSink on_clock_sample_;
  zmq::socket_t socket_;
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  bool accepted_ = false;
  uint64_t welcomes_ = 0;
  uint64_t messages_sent_ = 0, messages_received_ = 0;
  uint64_t last_hello_ns_ = 0;
  uint64_t discarded_ = 0;
  uint64_t lost_records_ = 0;
  uint64_t last_refusal_log_ns_ = 0;
  uint64_t last_spool_error_log_ns_ = 0;
  std::unique_ptr<Spool> spool_;
  uint64_t waiting_since_ns_ = 0;     // no reply yet since then (0: a reply came)
  uint64_t last_silence_log_ns_ = 0;
  uint64_t last_reconnect_ns_ = 0;
  AckTimer ack_timer_;
  std::vector<uint64_t> detail_comms_;  // the collector's last DetailRequest
  uint64_t detail_at_ns_ = 0;           // ... when it came
  bool warned_unknown_message_ = false;  // a message of a newer collector was said once
};

// A batch without its collective records and waits (same instance id and
// seq; processes, communicators, ends, errors, clock samples and drops kept);
// `records` gets how many were taken out. nullopt: not a readable batch.
std::optional<std::string> strip_detail(const std::string& batch_bytes, uint64_t& records);

// Reads /proc/sys/kernel/random/boot_id (empty if unreadable).
std::string boot_id();

}  // namespace rankscope::agent
