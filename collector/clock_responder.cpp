#include "collector/clock_responder.h"

#include <vector>

#include "collector/ingest/rate_limit.h"
#include "common/log.h"
#include "proto/agent_wire.h"

namespace rankscope::collector {

namespace {
constexpr int kReceiveHighWaterMark = 16;  // probes waiting per connection
constexpr int kPollMs = 100;               // how soon a stop is seen
// A larger frame is refused by libzmq before it is buffered. Probes are a
// few dozen bytes; CurveZMQ's handshake commands (INITIATE: a vouch and
// the socket's metadata) are a few hundred, and pass this check too.
constexpr int64_t kMaxFrameBytes = 4096;

std::string frame(const zmq::message_t& message) {
  return std::string(static_cast<const char*>(message.data()), message.size());
}
}  // namespace

std::string clock_endpoint(const std::string& clock_listen, const std::string& listen) {
  if (clock_listen == "none") return "";
  if (clock_listen != "auto") return clock_listen;
  const size_t colon = listen.rfind(':');
  if (listen.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon < 6) return "";
  return listen.substr(0, colon) + ":*";
}

ClockResponder::ClockResponder(const Clock& clock) : socket_(context_, zmq::socket_type::router), clock_(clock) {}

Result<std::unique_ptr<ClockResponder>> ClockResponder::start(const std::string& endpoint, const curve::KeyFile* key,
                                                              const std::string& allow_dir, const Clock& clock) {
  std::unique_ptr<ClockResponder> responder(new ClockResponder(clock));
  if (key) {
    auto zap = ZapHandler::start(responder->context_, allow_dir);
    if (!zap) return zap.error();
    responder->zap_ = std::move(*zap);
  }
  zmq::socket_t& socket = responder->socket_;
  try {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::router_mandatory, 0);
    socket.set(zmq::sockopt::rcvhwm, kReceiveHighWaterMark);
    socket.set(zmq::sockopt::maxmsgsize, kMaxFrameBytes);
    if (key) curve::apply_server(socket, *key, kAgentDomain);
    socket.bind(endpoint);
    responder->endpoint_ = socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(Errc::io, "cannot listen for clock probes on " + endpoint + ": " + e.what());
  }
  const size_t colon = responder->endpoint_.rfind(':');
  const unsigned long port = colon == std::string::npos ? 0 : std::strtoul(responder->endpoint_.c_str() + colon + 1,
                                                                           nullptr, 10);
  if (port == 0 || port > 65535)
    return make_error(Errc::io, "clock probes: no TCP port in the bound endpoint " + responder->endpoint_);
  responder->port_ = static_cast<uint16_t>(port);
  responder->thread_ = std::thread([r = responder.get()] { r->serve(); });
  return responder;
}

ClockResponder::~ClockResponder() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ClockResponder::serve() {
  RateLimiter limit(kMaxProbesPerS, 0);
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(kPollMs));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      RS_LOG(error, "clock probes: poll failed (%s); none is answered on the clock socket from now on", e.what());
      return;
    }
    for (;;) {
      std::vector<zmq::message_t> parts;
      uint64_t t2 = 0;
      try {
        for (;;) {
          zmq::message_t part;
          if (!socket_.recv(part, parts.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none)) break;
          if (parts.empty()) t2 = clock_.realtime_ns();
          const bool more = part.more();
          parts.push_back(std::move(part));
          if (!more) break;
        }
      } catch (const zmq::error_t& e) {
        RS_LOG(warn, "clock probes: receive failed: %s", e.what());
        break;
      }
      if (parts.empty()) break;
      std::string who = frame(parts.front());
      try {
        if (const char* user = parts.back().gets("User-Id")) who = std::string("key ") + user;
      } catch (const zmq::error_t&) {
        // No User-Id: plaintext (--insecure); the budget is the connection's.
      }
      std::optional<uint64_t> t1;
      if (parts.size() == 2) t1 = proto::read_clock_probe(std::string_view(
                                 static_cast<const char*>(parts.back().data()), parts.back().size()));
      if (!t1 || !limit.admit(who, parts.back().size(), clock_.monotonic_ns())) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const std::string reply = proto::encode_clock_reply(*t1, t2, clock_.realtime_ns());
      try {
        socket_.send(parts.front(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        socket_.send(zmq::buffer(reply), zmq::send_flags::dontwait);
        answered_.fetch_add(1, std::memory_order_relaxed);
      } catch (const zmq::error_t& e) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

}  // namespace rankscope::collector
