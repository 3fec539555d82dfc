#include "tools/sim/prober.h"

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/log.h"
#include "proto/agent_wire.h"

namespace rankscope::sim {

namespace {
constexpr int64_t kProbeIntervalNs = 1'000'000'000;  // the agent's default
constexpr int64_t kRetryNs = 10'000'000;             // a probe not taken (no connection yet) is tried again
constexpr size_t kMaxInFlight = 16;
}  // namespace

ClockProber::ClockProber(uint64_t t0_real, double jitter_ms, size_t nodes) : t0_real_(t0_real), jitter_ms_(jitter_ms) {
  context_.set(zmq::ctxopt::max_sockets, static_cast<int>(nodes) + 64);  // ZeroMQ's default cap is 1023
  thread_ = std::thread([this] { loop(); });
}

ClockProber::~ClockProber() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

int64_t ClockProber::now_rel() const {
  return static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0_real_);
}

void ClockProber::open(int node, const NodeDef& def, const std::string& endpoint, uint64_t seed) {
  std::lock_guard lock(mutex_);
  requests_.push_back({node, &def, endpoint, seed});
}

void ClockProber::close(int node) {
  std::lock_guard lock(mutex_);
  requests_.push_back({node, nullptr, "", 0});
}

std::vector<ClockProber::Answer> ClockProber::take(int node) {
  std::lock_guard lock(mutex_);
  auto it = answered_.find(node);
  if (it == answered_.end()) return {};
  std::vector<Answer> out;
  out.swap(it->second);
  return out;
}

void ClockProber::apply_requests() {
  std::vector<Request> requests;
  {
    std::lock_guard lock(mutex_);
    requests.swap(requests_);
  }
  for (Request& r : requests) {
    if (r.endpoint.empty()) {
      nodes_.erase(r.node);
      continue;
    }
    auto it = nodes_.find(r.node);
    if (it != nodes_.end() && it->second.endpoint == r.endpoint) continue;
    Node& node = nodes_[r.node];
    node.def = r.def;
    node.endpoint = r.endpoint;
    node.rng.seed(r.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(r.node) * 7919ull + 11);
    node.next_ns = 0;
    node.in_flight.clear();
    node.socket = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    node.socket->set(zmq::sockopt::linger, 0);
    node.socket->set(zmq::sockopt::immediate, 1);
    node.socket->set(zmq::sockopt::reconnect_ivl, 100);
    node.socket->connect(r.endpoint);
  }
}

void ClockProber::probe(Node& node, int64_t rel_ns) {
  // The simulated network's delay on the way out: as if the probe had left
  // earlier than it did (t1 stamped before it); the way back is added at
  // receipt. As SimAgent::send_probe.
  const double mean = jitter_ms_ * 1e6 / 2;
  std::exponential_distribution<double> jitter(mean > 0 ? 1.0 / mean : 1e9);
  const int64_t out = mean > 0 ? static_cast<int64_t>(jitter(node.rng)) : 0;
  const int64_t back = mean > 0 ? static_cast<int64_t>(jitter(node.rng)) : 0;
  const uint64_t sent_real = SystemClock::read(CLOCK_REALTIME);
  const uint64_t t1 = node.def->clock_at(static_cast<int64_t>(sent_real - t0_real_) - out);
  const std::string bytes = proto::encode_clock_probe(t1);
  bool sent = false;
  try {
    sent = node.socket->send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    sent = false;
  }
  if (!sent) {
    node.next_ns = rel_ns + kRetryNs;
    return;
  }
  node.in_flight[t1] = {back, sent_real};
  while (node.in_flight.size() > kMaxInFlight) node.in_flight.erase(node.in_flight.begin());
  node.next_ns = (node.next_ns == 0 ? rel_ns : node.next_ns) + kProbeIntervalNs;
  if (node.next_ns <= rel_ns) node.next_ns = rel_ns + kProbeIntervalNs;  // fell behind: no burst to catch up
}

void ClockProber::read(int index, Node& node) {
  for (;;) {
    zmq::message_t reply;
    zmq::recv_result_t got;
    try {
      got = node.socket->recv(reply, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    const uint64_t now_real = SystemClock::read(CLOCK_REALTIME);
    auto times = proto::read_clock_reply(std::string_view(static_cast<const char*>(reply.data()), reply.size()));
    if (!times) continue;
    auto probe = node.in_flight.find((*times)[0]);
    if (probe == node.in_flight.end()) continue;
    const uint64_t t4 = node.def->clock_at(static_cast<int64_t>(now_real - t0_real_) + probe->second.back);
    std::lock_guard lock(mutex_);
    answered_[index].push_back({{(*times)[0], (*times)[1], (*times)[2], t4},
                                static_cast<int64_t>((*times)[1] - probe->second.sent_real),
                                static_cast<int64_t>(now_real - (*times)[2])});
    node.in_flight.erase(probe);
  }
}

void ClockProber::loop() {
  std::vector<zmq::pollitem_t> items;
  std::vector<std::pair<int, Node*>> polled;
  while (!stop_.load()) {
    apply_requests();
    const int64_t rel = now_rel();
    int64_t next = rel + 10'000'000;  // requests are looked at every 10 ms at least
    items.clear();
    polled.clear();
    for (auto& [index, node] : nodes_) {
      if (node.next_ns <= rel) probe(node, rel);
      next = std::min(next, node.next_ns);
      items.push_back({node.socket->handle(), 0, ZMQ_POLLIN, 0});
      polled.emplace_back(index, &node);
    }
    const auto wait = std::chrono::milliseconds(std::max<int64_t>(0, (next - rel) / 1'000'000));
    if (items.empty()) {
      std::this_thread::sleep_for(wait);
      continue;
    }
    zmq::poll(items.data(), items.size(), wait);
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].revents & ZMQ_POLLIN) read(polled[i].first, *polled[i].second);
  }
}

}  // namespace rankscope::sim
