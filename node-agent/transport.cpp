#include "node-agent/transport.h"

#include <sys/utsname.h>

#include <algorithm>

#include "common/log.h"
#include "common/version.h"
#include "node-agent/identify.h"
#include "proto/agent_wire.h"
#include "proto/codec.h"

namespace rankscope::agent {

namespace {
constexpr uint64_t kHelloRetryNs = 2'000'000'000ull;
// Batches sent and not yet acked at once (the socket's send high-water mark
// is the same): a replay of a long outage goes at the pace of the acks.
constexpr size_t kMaxInFlight = 1000;
// The longest wait for an ack before a batch is sent again.
constexpr uint64_t kMaxAckWaitNs = 60'000'000'000ull;
// Silence from the collector this long before the first reply: say why it may be.
constexpr uint64_t kNoReplyNs = 10'000'000'000ull;
constexpr uint64_t kNoReplyLogIntervalNs = 60'000'000'000ull;
constexpr const char* kAgentVersion = kVersion;
}  // namespace

std::string boot_id() {
  auto id = read_file("/proc/sys/kernel/random/boot_id");
  if (!id) return {};
  std::string text = *id;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::optional<std::string> strip_detail(const std::string& batch_bytes, uint64_t& records) {
  capnp::MallocMessageBuilder message;
  bool ok = false;
  records = 0;
  auto read = proto::read_packed<wire::AgentMessage>(batch_bytes, proto::ReadLimits{}, [&](auto in) {
    if (in.which() != wire::AgentMessage::BATCH) return;
    auto from = in.getBatch();
    for (auto c : from.getCollectives()) records += c.getCount();
    for (auto w : from.getWaits()) records += w.getCount();
    auto to = message.initRoot<wire::AgentMessage>().initBatch();
    to.setInstanceId(from.getInstanceId());
    to.setSeq(from.getSeq());
    to.setProcesses(from.getProcesses());
    to.setComms(from.getComms());
    to.setCommEnds(from.getCommEnds());
    to.setClockSamples(from.getClockSamples());
    to.setDrops(from.getDrops());
    to.setCreatedNs(from.getCreatedNs());
    to.setBaseNs(from.getBaseNs());
    to.setCommTable(from.getCommTable());
    to.setAsyncErrors(from.getAsyncErrors());
    ok = true;
  });
  if (!read || !ok) return std::nullopt;
  return proto::to_packed(message);
}

Transport::Transport(zmq::context_t& context, const Options& options, const Clock& clock, uint64_t instance_id,
                     ClockSampleSink on_clock_sample, std::unique_ptr<Spool> spool)
    : options_(options),
      clock_(clock),
      instance_id_(instance_id),
      on_clock_sample_(std::move(on_clock_sample)),
      socket_(context, zmq::socket_type::dealer),
      spool_(std::move(spool)),
      ack_timer_(static_cast<uint64_t>(options.ack_timeout_ms) * 1'000'000ull, kMaxAckWaitNs) {
  // What an earlier run left unacknowledged goes first, as it was (its own
  // instance id and seq: the collector recognises what it already stored).
  if (spool_) {
    // Their bytes stay on disk until each is sent.
    for (auto& recovered : spool_->take_recovered())
      queue_.push_back(Pending{recovered.instance, recovered.seq, std::string(), recovered.ref});
    enforce_bounds();
  }
  socket_.set(zmq::sockopt::linger, 0);
  // Queue only on a live connection: while the collector is away, batches
  // wait in our own bounded queue, not in ZeroMQ's.
  socket_.set(zmq::sockopt::immediate, 1);
  socket_.set(zmq::sockopt::sndhwm, static_cast<int>(kMaxInFlight));
  socket_.set(zmq::sockopt::reconnect_ivl, 100);
  socket_.set(zmq::sockopt::reconnect_ivl_max, 2000);
  curve::apply(socket_, options_.keys);
  socket_.connect(options_.collector);
  waiting_since_ns_ = now();
  send_hello();
}

bool Transport::send_bytes(const std::string& bytes) {
  try {
    auto sent = socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    if (sent) ++messages_sent_;
    return sent.has_value();
  } catch (const zmq::error_t& e) {
    RS_LOG(warn, "send to %s failed: %s", options_.collector.c_str(), e.what());
    return false;
  }
}

void Transport::send_hello() {
  proto::Hello hello;
  hello.node = options_.node;
  hello.instance_id = instance_id_;
  hello.boot_id = boot_id();
  hello.agent_version = kAgentVersion;
  utsname uts{};
  if (uname(&uts) == 0) hello.kernel_release = uts.release;
  hello.monotonic_ns = now();
  hello.realtime_ns = clock_.realtime_ns();
  // Not sent (no connection yet): try again on the next service() call.
  last_hello_ns_ = send_bytes(proto::encode_hello(hello)) ? now() : 0;
}

void Transport::submit(uint64_t seq, std::string bytes) {
  SpoolRef ref;
  if (spool_) {
    auto written = spool_->append(instance_id_, seq, bytes);
    if (written) {
      ref = *written;
    } else if (now() - last_spool_error_log_ns_ > 30'000'000'000ull || last_spool_error_log_ns_ == 0) {
      // Kept in memory only (a full disk must not stop tracing).
      RS_LOG(error, "%s; batches are kept in memory only until the spool is writable again",
             written.error().message.c_str());
      last_spool_error_log_ns_ = now();
    }
    spool_->maybe_sync(now());
  }
  queued_bytes_ += bytes.size();
  queue_.push_back(Pending{instance_id_, seq, std::move(bytes), ref});
  enforce_bounds();
  // Sent now only if every older batch went before it (order is kept).
  if (accepted_ && (queue_.size() == 1 || queue_[queue_.size() - 2].last_sent_ns != 0)) send_pending(queue_.back());
}

void Transport::drop_detail(Pending& pending) {
  uint64_t records = 0;
  auto summary = pending.bytes.empty() && spool_ ? spool_->read(pending.ref) : Result<std::string>(pending.bytes);
  std::optional<std::string> stripped;
  if (summary) stripped = strip_detail(*summary, records);
  queued_bytes_ -= pending.bytes.size();
  pending.bytes = stripped ? std::move(*stripped) : std::string();
  queued_bytes_ += pending.bytes.size();
  pending.ref = SpoolRef{};
  if (!pending.stripped) ++discarded_;
  pending.stripped = true;
  lost_records_ += records;
}

void Transport::enforce_bounds() {
  // The spool: its oldest segment goes; the batches in it keep their summaries in memory.
  while (spool_) {
    auto segment = spool_->segment_to_drop();
    if (!segment) break;
    size_t before = discarded_;
    for (auto& pending : queue_)
      if (pending.ref.segment == *segment) drop_detail(pending);
    spool_->drop_segment(*segment);
    RS_LOG(warn, "spool %s is full (%llu bytes): the records of its %zu oldest batch(es) are dropped, their summaries kept",
           spool_->dir().c_str(), static_cast<unsigned long long>(spool_->bytes()), discarded_ - before);
  }
  // Memory: batches on disk are only dropped from the cache; the others (no
  // spool, or a summary) lose their records, then go whole, oldest first.
  for (auto& pending : queue_) {
    if (queued_bytes_ <= options_.max_unacked_bytes) break;
    if (pending.ref.segment != 0 && !pending.bytes.empty()) {
      queued_bytes_ -= pending.bytes.size();
      std::string().swap(pending.bytes);
    }
  }
  for (auto& pending : queue_) {
    if (queued_bytes_ <= options_.max_unacked_bytes) break;
    if (pending.ref.segment == 0 && !pending.bytes.empty() && !pending.stripped) drop_detail(pending);
  }
  while (queued_bytes_ > options_.max_unacked_bytes && queue_.size() > 1 && queue_.front().ref.segment == 0) {
    queued_bytes_ -= queue_.front().bytes.size();
    if (!queue_.front().stripped) ++discarded_;
    queue_.pop_front();
  }
}

bool Transport::send_pending(Pending& pending) {
  if (pending.bytes.empty()) {
    if (pending.ref.segment == 0 || !spool_) return true;  // nothing left to send; resend_due forgets it
    auto bytes = spool_->read(pending.ref);
    if (!bytes) {
      RS_LOG(error, "%s; batch %llu is lost", bytes.error().message.c_str(), static_cast<unsigned long long>(pending.seq));
      pending.ref = SpoolRef{};
      ++discarded_;
      return true;
    }
    if (!send_bytes(*bytes)) return false;
  } else if (!send_bytes(pending.bytes)) {
    return false;
  }
  if (pending.last_sent_ns != 0) ++pending.resends;
  pending.last_sent_ns = now();
  return true;
}

uint64_t Transport::ack_wait_ns(const Pending& pending) const {
  // A collector that is slow, not gone, would otherwise get the same batches
  // again every ack timeout on top of its backlog: the wait follows the acks'
  // round trip, and doubles with each re-send (2, 4, 8 ... s by default), up
  // to a minute.
  return ack_timer_.wait_ns(pending.resends);
}

void Transport::send_clock_probe() {
  if (!accepted_) return;
  send_bytes(proto::encode_clock_probe(now()));
}

void Transport::send_heartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill) {
  if (!accepted_) return;
  proto::HeartbeatHeader header{instance_id_, now(), static_cast<uint32_t>(queue_.size())};
  send_bytes(proto::encode_heartbeat(header, [&](wire::Heartbeat::Builder hb) {
    fill(hb);
    auto drops = hb.getDrops();
    drops.setSendQueueFull(discarded_);
    drops.setLostRecords(lost_records_);
    drops.setSpoolDamaged(spool_damaged());
  }));
}

void Transport::service() {
  for (;;) {
    zmq::message_t reply;
    zmq::recv_result_t got;
    try {
      got = socket_.recv(reply, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      RS_LOG(warn, "receive from %s failed: %s", options_.collector.c_str(), e.what());
      break;
    }
    if (!got) break;
    ++messages_received_;
    waiting_since_ns_ = 0;
    handle(std::string(static_cast<const char*>(reply.data()), reply.size()));
  }
  warn_if_unanswered();
  if (!accepted_ && (last_hello_ns_ == 0 || now() - last_hello_ns_ > kHelloRetryNs)) send_hello();
  if (accepted_) resend_due();
}

void Transport::warn_if_unanswered() {
  // A CurveZMQ handshake the collector refuses (unknown key, wrong collector
  // key, plaintext against CurveZMQ) gives this side no error: only silence.
  if (waiting_since_ns_ == 0 || now() - waiting_since_ns_ < kNoReplyNs) return;
  // libzmq gives up on a connection whose handshake was refused (a key not
  // yet in the allow-list): connect anew now and then, so that a key added
  // later is taken without restarting the agent.
  if (now() - last_reconnect_ns_ >= kNoReplyNs) {
    last_reconnect_ns_ = now();
    try {
      socket_.disconnect(options_.collector);
    } catch (const zmq::error_t&) {
      // Already gone: libzmq dropped it after the refusal.
    }
    socket_.connect(options_.collector);
  }
  if (last_silence_log_ns_ != 0 && now() - last_silence_log_ns_ < kNoReplyLogIntervalNs) return;
  last_silence_log_ns_ = now();
  if (options_.keys.enabled())
    RS_LOG(error, "no reply from collector %s in %llu s: is it running, with CurveZMQ, is --collector-key its public "
                  "key, and is this node's public key %s in its allow-list (bound to node %s)?",
           options_.collector.c_str(), static_cast<unsigned long long>((now() - waiting_since_ns_) / 1'000'000'000ull),
           options_.keys.public_key.c_str(), options_.node.c_str());
  else
    RS_LOG(error, "no reply from collector %s in %llu s: is it running, and with --insecure? (a collector with "
                  "CurveZMQ never answers a plaintext agent)",
           options_.collector.c_str(), static_cast<unsigned long long>((now() - waiting_since_ns_) / 1'000'000'000ull));
}

void Transport::handle(const std::string& bytes) {
  auto result = proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto message) {
    switch (message.which()) {
      case wire::CollectorMessage::HELLO_REPLY: {
        auto reply = message.getHelloReply();
        if (reply.getAccepted()) {
          if (!accepted_)
            RS_LOG(info, "collector %s accepted node %s (%zu batch(es) to send)", options_.collector.c_str(),
                   options_.node.c_str(), queue_.size());
          if (!accepted_) {
            ++welcomes_;
            ack_timer_.reset();  // a new connection: what was learnt of the old one no longer holds
          }
          accepted_ = true;
          for (auto& pending : queue_) {  // send all again, in order (a new connection: no backing off)
            pending.last_sent_ns = 0;
            pending.resends = 0;
          }
          resend_due();
        } else if (now() - last_refusal_log_ns_ > 30'000'000'000ull || last_refusal_log_ns_ == 0) {
          RS_LOG(error, "collector %s refused node %s: %s", options_.collector.c_str(), options_.node.c_str(),
                 reply.getReason().cStr());
          last_refusal_log_ns_ = now();
        }
        break;
      }
      case wire::CollectorMessage::ACK: {
        auto ack = message.getAck();
        // Batches of an earlier instance (replayed from the spool) are acked under their own id.
        auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) {
          return p.seq == ack.getSeq() && p.instance == ack.getInstanceId();
        });
        if (it != queue_.end()) {
          if (it->resends == 0 && it->last_sent_ns != 0) ack_timer_.sample(now() - it->last_sent_ns);
          queued_bytes_ -= it->bytes.size();
          if (spool_) spool_->acked(it->instance, it->seq, it->ref);
          queue_.erase(it);
        }
        break;
      }
      case wire::CollectorMessage::CLOCK_REPLY: {
        auto reply = message.getClockReply();
        on_clock_sample_(reply.getT1(), reply.getT2(), reply.getT3(), now());
        break;
      }
      case wire::CollectorMessage::ERROR: {
        auto error = message.getError();
        if (error.getCode() == wire::ErrorCode::NEED_HELLO) {
          // The collector restarted and forgot this connection. Every
          // message in flight gets this answer: one Hello for all of them
          // (service() sends it again if it goes unanswered).
          if (accepted_) {
            RS_LOG(info, "collector %s asks for a new hello", options_.collector.c_str());
            accepted_ = false;
            send_hello();
          }
        } else {
          RS_LOG(warn, "collector %s: %s", options_.collector.c_str(), error.getMessage().cStr());
        }
        break;
      }
      case wire::CollectorMessage::DETAIL: {
        auto comms = message.getDetail().getComms();
        if (comms.size() > 0 && detail_comms_.empty())
          RS_LOG(info, "collector %s asks for NCCL's proxy steps of %u communicator(s)", options_.collector.c_str(),
                 comms.size());
        detail_comms_.clear();
        for (uint64_t comm : comms) {
          if (detail_comms_.size() >= kMaxDetailComms) break;
          detail_comms_.push_back(comm);
        }
        detail_at_ns_ = now();
        break;
      }
      default:
        // A newer collector's (it may send one with every reply): said once.
        if (!warned_unknown_message_) RS_LOG(warn, "collector sent a message this agent does not know; ignored");
        warned_unknown_message_ = true;
        break;
    }
  });
  if (!result) RS_LOG(warn, "from collector %s: %s", options_.collector.c_str(), result.error().message.c_str());
}

std::vector<uint64_t> Transport::detail_comms(uint64_t lease_ns) const {
  if (detail_comms_.empty() || now() - detail_at_ns_ > lease_ns) return {};
  return detail_comms_;
}

void Transport::resend_due() {
  uint64_t t = now();
  // Never more than the socket's high-water mark in flight at once: the rest
  // wait here (or on disk), not in ZeroMQ's memory.
  size_t in_flight = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->bytes.empty() && it->ref.segment == 0) {  // nothing left of it (unreadable, or lost)
      it = queue_.erase(it);
      continue;
    }
    if (it->last_sent_ns != 0 && t - it->last_sent_ns < ack_wait_ns(*it)) {
      ++in_flight;
      ++it;
      continue;
    }
    if (in_flight >= kMaxInFlight) break;
    if (!send_pending(*it)) break;  // no connection now; keep order, try later
    ++in_flight;
    ++it;
  }
  if (spool_) spool_->maybe_sync(t);
}

}  // namespace rankscope::agent
