#pragma once
// The agent's side of the wire: a ZeroMQ DEALER socket to the collector.
// Hello first; then batches, each kept until the collector acknowledges that
// it is durably stored, re-sent when no ack came in time (a collector that
// restarted, a network that dropped). Never blocks the caller.
//
// In a fleet of collectors (docs/operations.md, "A fleet of collectors")
// the configured collector's HelloReply names the members, and a FleetMap
// from any of them says when they change. The agent then holds a connection
// to every member (each with the member's own CurveZMQ public key, as the
// member wrote it to etcd), and sends each key's batches (a job's: key
// "job:ID") to the member that rendezvous hashing makes its owner
// (common/placement.h). Each key's batches are a stream of their own: an
// instance id of their own, numbered 1, 2, 3... When a key's owner changes
// (a collector died, or joined) its batches not yet acknowledged are sent
// to the new owner at once, from memory or the spool, under their own
// instance id and seq (the collectors' duplicate check is by node, instance
// and seq: nothing is stored twice on one collector), after a batch that
// announces the key's processes and communicators again (take_moved).
// Heartbeats and clock probes go to every member. A collector that answers
// clock probes on a socket of their own (HelloReply.clockPort) gets them
// there, from a ZeroMQ context of their own, so that no batch queues ahead
// of them on either side; while that socket has no connection they go on
// the link itself.
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
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <zmq.hpp>

#include "common/ack_timer.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/placement.h"
#include "node-agent/options.h"
#include "node-agent/spool.h"
#include "proto/agent.capnp.h"

namespace rankscope::agent {

namespace wire = ::rankscope::proto::wire;

class Transport {
 public:
  // A clock probe's times, and the collector that answered (its fleet id; "" alone).
  using ClockSampleSink =
      std::function<void(uint64_t t1, uint64_t t2, uint64_t t3, uint64_t t4, const std::string& collector)>;

  // `spool` may be null: unacked batches are then kept in memory only.
  Transport(zmq::context_t& context, const Options& options, const Clock& clock, uint64_t instance_id,
            ClockSampleSink on_clock_sample, std::unique_ptr<Spool> spool = nullptr);

  // Takes a serialised batch of the key's stream (batch_id); it stays queued
  // (and spooled) until acked. `first`: sent before the key's batches not
  // yet acknowledged (a new owner's announcement).
  void submit(uint64_t instance, uint64_t seq, std::string bytes, const std::string& key, bool first = false);
  void submit(uint64_t seq, std::string bytes) { submit(instance_id_, seq, std::move(bytes), ""); }
  // The instance id and seq of the next batch of `key` ("": the agent's own
  // instance, without a fleet).
  std::pair<uint64_t, uint64_t> batch_id(const std::string& key);
  // Starts `key`'s stream if it has none. Everything went to the configured
  // collector before: a key placed elsewhere is moved (take_moved).
  void track(const std::string& key);
  // Reads every reply waiting, re-sends what is due. Never waits.
  void service();
  void send_clock_probe();
  // `fill` adds what the caller knows (drops, process health) to the
  // heartbeat; sent to every collector that accepted this agent.
  // Whether a collector's connection took it (false: none is up, or none said hello).
  bool send_heartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill);

  // The configured collector accepted this agent.
  bool accepted() const { return links_.front()->accepted; }
  // How many times a collector has accepted this agent's Hello: a change
  // means a new collector run (or connection), which may not know what the
  // agent told the last one.
  uint64_t welcomes() const { return welcomes_; }
  // Whether a fleet's members are known (batches are then sent by key).
  bool in_fleet() const { return !members_.empty(); }
  // Every collector that accepted this agent (one at least) reads a batch's
  // CollectiveTable, and batches compressed (sent so to each that does). A
  // batch sent to one that does not gets its table rewritten as
  // CollectiveColumns first (a collector replaced by an older one).
  bool reads_compact() const;
  // The collector `key`'s batches go to now: its fleet id ("" alone, or
  // before the configured collector said its id).
  std::string route(const std::string& key) const;
  // The keys whose owner changed since the last call (each key that has a
  // stream). Nothing of such a key is sent until its announcement is
  // submitted (submit's `first`): its new owner must know its processes and
  // communicators before its records.
  std::vector<std::string> take_moved();
  // Forgets the streams of keys neither live (`live`: the keys of traced
  // processes) nor queued: a later change of owner has nothing of them to announce.
  void forget_streams(const std::set<std::string>& live);
  // Every socket to poll for replies.
  std::vector<zmq::pollitem_t> poll_items() const;
  size_t unacked() const { return queue_.size(); }
  // Messages sent to and received from the collector so far (all kinds).
  uint64_t messages_sent() const { return messages_sent_; }
  uint64_t messages_received() const { return messages_received_; }
  uint64_t discarded_batches() const { return discarded_; }
  uint64_t lost_records() const { return lost_records_; }
  uint64_t spool_damaged() const { return spool_ ? spool_->damage().bad_tails : 0; }
  uint64_t memory_bytes() const { return queued_bytes_; }
  // How long a batch sent once now waits for its ack from the configured
  // collector (common/ack_timer.h).
  uint64_t ack_timeout_ns() const;
  const Spool* spool() const { return spool_.get(); }
  // The configured collector's socket.
  zmq::socket_t& socket() { return *links_.front()->socket; }
  // The communicators whose NCCL proxy steps the collector wants now
  // (its last DetailRequest), until `lease_ns` passes without another: a
  // collector that stopped asking, or died, does not leave them on.
  std::vector<uint64_t> detail_comms(uint64_t lease_ns) const;
  static constexpr size_t kMaxDetailComms = 4096;  // more in a request are not kept

 private:
  // One connection: to the configured collector (the first), or to a member
  // of the fleet.
  struct Link {
    Link(zmq::context_t& context, std::string endpoint, curve::ClientKeys keys, uint64_t ack_min_ns,
         uint64_t ack_max_ns);
    std::string id;  // the collector's fleet id ("" alone, or not said yet)
    std::string endpoint;
    curve::ClientKeys keys;
    std::unique_ptr<zmq::socket_t> socket;
    bool accepted = false;
    bool reads_compact = false;  // its HelloReply said so
    uint64_t last_hello_ns = 0;
    uint64_t waiting_since_ns = 0;  // no reply yet since then (0: a reply came)
    uint64_t last_silence_log_ns = 0;
    uint64_t last_reconnect_ns = 0;
    uint64_t last_refusal_log_ns = 0;
    AckTimer ack_timer;
    std::vector<uint64_t> detail_comms;  // the collector's last DetailRequest
    uint64_t detail_at_ns = 0;           // ... when it came
    // Where its collector answers clock probes apart from batches
    // (HelloReply.clockPort, on this link's host); null: none said.
    std::unique_ptr<zmq::socket_t> clock_socket;
    uint16_t clock_port = 0;
  };
  struct Pending {
    uint64_t instance;
    uint64_t seq;
    std::string bytes;          // empty: only on disk (read back to send)
    SpoolRef ref;               // segment 0: not on disk
    uint64_t last_sent_ns = 0;  // 0: never sent
    uint32_t resends = 0;       // sent again for want of an ack (the wait doubles each time)
    bool stripped = false;      // its records were dropped (counted once)
    std::string key = {};       // its stream's placement key ("": no fleet)
    bool key_known = true;      // false: recovered from the spool, key not read yet
    const Link* to = nullptr;   // where it was last sent
  };
  uint64_t now() const { return clock_.monotonic_ns(); }
  // A new connection, its Hello sent.
  std::unique_ptr<Link> open_link(const std::string& endpoint, const curve::ClientKeys& keys, const std::string& id);
  bool send_bytes(Link& link, const std::string& bytes);
  void send_hello(Link& link);
  // Connects the link's clock socket to `port` on its collector's host (0: none).
  void open_clock(Link& link, uint16_t port);
  // Reads the clock replies waiting on the link's clock socket.
  void take_clock_replies(Link& link);
  void handle(Link& link, const std::string& bytes);
  void take_fleet(Link& link, wire::FleetMap::Reader map);
  // The link `key`'s batches go to (the configured collector's when there is no fleet).
  Link* link_for(const std::string& key);
  void resend_due();
  // How long to wait for the ack of a batch sent `resends` times already.
  uint64_t ack_wait_ns(const Pending& pending) const;
  // Sends one pending batch (reading it from the spool if needed).
  bool send_pending(Link& link, Pending& pending);
  // Reads the key of a batch recovered from the spool.
  void read_key(Pending& pending);
  // Keeps memory and the spool within their bounds, counting what is lost.
  void enforce_bounds();
  // The batch's records go, its summaries stay (both counted).
  void drop_detail(Pending& pending);
  void warn_if_unanswered(Link& link);

  zmq::context_t& context_;
  // The clock sockets' own: its I/O thread (which encrypts what goes out)
  // is never busy with a batch when a probe leaves. Before links_: it
  // outlives their sockets.
  zmq::context_t clock_context_{1};
  const Options& options_;
  const Clock& clock_;
  uint64_t instance_id_;
  uint64_t seq_ = 0;  // the last batch of the agent's own instance
  ClockSampleSink on_clock_sample_;
  std::vector<std::unique_ptr<Link>> links_;  // [0]: the configured collector
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  uint64_t welcomes_ = 0;
  uint64_t messages_sent_ = 0, messages_received_ = 0;
  uint64_t discarded_ = 0;
  uint64_t lost_records_ = 0;
  uint64_t last_spool_error_log_ns_ = 0;
  std::unique_ptr<Spool> spool_;
  bool warned_unknown_message_ = false;  // a message of a newer collector was said once
  // The fleet, as the collectors last said (empty: alone).
  std::vector<fleet::Member> members_;
  // By key: its stream (instance id, last seq) and the collector its batches went to last.
  struct Stream {
    uint64_t instance = 0, seq = 0;
    std::string owner;
    bool held = false;  // moved, and not announced to its new owner yet: nothing of it is sent
  };
  std::map<std::string, Stream> streams_;
  std::vector<std::string> moved_;
  // Streams whose owner changed: held, and said by take_moved().
  void refresh_owners();
  static constexpr size_t kMaxMembers = 256;  // more in a FleetMap are not taken (a connection each)
};

// A batch without its collective records and waits (same instance id and
// seq; processes, communicators, ends, errors, clock samples and drops kept);
// `records` gets how many were taken out. nullopt: not a readable batch.
std::optional<std::string> strip_detail(const std::string& batch_bytes, uint64_t& records);

// A random agent instance (or stream) id, never 0.
uint64_t random_instance_id();

// Reads /proc/sys/kernel/random/boot_id (empty if unreadable).
std::string boot_id();

}  // namespace rankscope::agent
