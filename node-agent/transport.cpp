#include "node-agent/transport.h"

#include <sys/utsname.h>

#include <algorithm>

#include "common/log.h"
#include "node-agent/identify.h"
#include "proto/codec.h"

namespace rankscope::agent {

namespace {
constexpr uint64_t kHelloRetryNs = 2'000'000'000ull;
// Silence from the collector this long before the first reply: say why it may be.
constexpr uint64_t kNoReplyNs = 10'000'000'000ull;
constexpr uint64_t kNoReplyLogIntervalNs = 60'000'000'000ull;
constexpr const char* kAgentVersion = "0.1.0";
}  // namespace

std::string boot_id() {
  auto id = read_file("/proc/sys/kernel/random/boot_id");
  if (!id) return {};
  std::string text = *id;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

Transport::Transport(zmq::context_t& context, const Options& options, const Clock& clock, uint64_t instance_id,
                     ClockSampleSink on_clock_sample)
    : options_(options),
      clock_(clock),
      instance_id_(instance_id),
      on_clock_sample_(std::move(on_clock_sample)),
      socket_(context, zmq::socket_type::dealer) {
  socket_.set(zmq::sockopt::linger, 0);
  // Queue only on a live connection: while the collector is away, batches
  // wait in our own bounded queue, not in ZeroMQ's.
  socket_.set(zmq::sockopt::immediate, 1);
  socket_.set(zmq::sockopt::sndhwm, 1000);
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
    return sent.has_value();
  } catch (const zmq::error_t& e) {
    RS_LOG(warn, "send to %s failed: %s", options_.collector.c_str(), e.what());
    return false;
  }
}

void Transport::send_hello() {
  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<wire::AgentMessage>().initHello();
  hello.setProtocolVersion(wire::PROTOCOL_VERSION);
  hello.setNode(options_.node);
  hello.setInstanceId(instance_id_);
  hello.setBootId(boot_id());
  hello.setAgentVersion(kAgentVersion);
  utsname uts{};
  if (uname(&uts) == 0) hello.setKernelRelease(uts.release);
  hello.setMonotonicNs(now());
  hello.setRealtimeNs(clock_.realtime_ns() + static_cast<uint64_t>(options_.test_clock_offset_ns));
  // Not sent (no connection yet): try again on the next service() call.
  last_hello_ns_ = send_bytes(proto::to_packed(message)) ? now() : 0;
}

void Transport::submit(uint64_t seq, std::string bytes) {
  queued_bytes_ += bytes.size();
  queue_.push_back(Pending{seq, std::move(bytes)});
  // Bounded memory: when the collector stays away too long the oldest batch
  // goes first, and the loss is counted and reported.
  while (queued_bytes_ > options_.max_unacked_bytes && queue_.size() > 1) {
    queued_bytes_ -= queue_.front().bytes.size();
    queue_.pop_front();
    ++discarded_;
  }
  if (accepted_ && send_bytes(queue_.back().bytes)) queue_.back().last_sent_ns = now();
}

void Transport::send_clock_probe() {
  if (!accepted_) return;
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::AgentMessage>().initClockProbe().setT1(now());
  send_bytes(proto::to_packed(message));
}

void Transport::send_heartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill) {
  if (!accepted_) return;
  capnp::MallocMessageBuilder message;
  auto hb = message.initRoot<wire::AgentMessage>().initHeartbeat();
  hb.setInstanceId(instance_id_);
  hb.setMonotonicNs(now());
  hb.setUnackedBatches(static_cast<uint32_t>(queue_.size()));
  fill(hb);
  hb.getDrops().setSendQueueFull(discarded_);
  send_bytes(proto::to_packed(message));
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
          accepted_ = true;
          for (auto& pending : queue_) pending.last_sent_ns = 0;  // send all again, in order
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
        if (ack.getInstanceId() != instance_id_) break;
        auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) { return p.seq == ack.getSeq(); });
        if (it != queue_.end()) {
          queued_bytes_ -= it->bytes.size();
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
          // The collector restarted and forgot this connection.
          if (accepted_) RS_LOG(info, "collector %s asks for a new hello", options_.collector.c_str());
          accepted_ = false;
          send_hello();
        } else {
          RS_LOG(warn, "collector %s: %s", options_.collector.c_str(), error.getMessage().cStr());
        }
        break;
      }
      default: RS_LOG(warn, "collector sent a message this agent does not know; ignored"); break;
    }
  });
  if (!result) RS_LOG(warn, "from collector %s: %s", options_.collector.c_str(), result.error().message.c_str());
}

void Transport::resend_due() {
  uint64_t t = now();
  uint64_t timeout = static_cast<uint64_t>(options_.ack_timeout_ms) * 1'000'000ull;
  for (auto& pending : queue_) {
    if (pending.last_sent_ns != 0 && t - pending.last_sent_ns < timeout) continue;
    if (!send_bytes(pending.bytes)) break;  // no connection now; keep order, try later
    pending.last_sent_ns = t;
  }
}

}  // namespace rankscope::agent
