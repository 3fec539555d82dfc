// The simulator's clock prober (tools/sim/prober.h) against a real ZeroMQ
// responder on loopback: probes leave from its thread every second, each
// reply becomes a sample on the node's clock with its real delays, and a
// closed node sends no more.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <zmq.hpp>

#include "common/clock.h"
#include "proto/agent_wire.h"
#include "tools/sim/prober.h"

namespace rankscope::sim {
namespace {

// Answers every probe waiting with t2 = t3 = now; returns how many.
int answer(zmq::socket_t& responder) {
  int answered = 0;
  zmq::message_t id, body;
  while (responder.recv(id, zmq::recv_flags::dontwait)) {
    (void)responder.recv(body, zmq::recv_flags::none);
    auto t1 = proto::read_clock_probe(std::string_view(static_cast<const char*>(body.data()), body.size()));
    EXPECT_TRUE(t1) << "only probes come here";
    if (!t1) continue;
    const uint64_t now = SystemClock::read(CLOCK_REALTIME);
    responder.send(id, zmq::send_flags::sndmore);
    responder.send(zmq::buffer(proto::encode_clock_reply(*t1, now, now)), zmq::send_flags::none);
    ++answered;
  }
  return answered;
}

TEST(SimClockProber, ProbesEachNodeFromItsOwnThreadUntilItIsClosed) {
  zmq::context_t context(1);
  zmq::socket_t responder(context, zmq::socket_type::router);
  responder.set(zmq::sockopt::linger, 0);
  responder.bind("tcp://127.0.0.1:*");
  const std::string endpoint = responder.get(zmq::sockopt::last_endpoint);

  NodeDef node;
  node.boot_ns = 5'000'000'000ull;  // its clock: 5 s at the run's start, no drift
  const uint64_t t0 = SystemClock::read(CLOCK_REALTIME);
  ClockProber prober(t0, 0, 4);
  prober.open(2, node, endpoint, 1);

  std::vector<ClockProber::Answer> answers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (answers.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    answer(responder);
    for (auto& a : prober.take(2)) answers.push_back(a);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(answers.size(), 2u) << "a probe at once, then one a second";
  EXPECT_TRUE(prober.take(1).empty()) << "a node never opened has none";
  const uint64_t now_on_node = node.clock_at(static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0));
  for (const auto& a : answers) {
    const auto& [t1, t2, t3, t4] = a.sample;
    EXPECT_GE(t1, node.boot_ns) << "on the node's clock";
    EXPECT_LE(t1, t4);
    EXPECT_LE(t4, now_on_node);
    EXPECT_LE(t2, t3);
    EXPECT_GE(a.in_ns, 0);
    EXPECT_GE(a.out_ns, 0);
    // No jitter: the round trip on the node's clock is the real one.
    EXPECT_EQ(static_cast<int64_t>(t4 - t1), a.in_ns + static_cast<int64_t>(t3 - t2) + a.out_ns);
  }
  EXPECT_LT(answers[0].sample[0], answers[1].sample[0]);

  prober.close(2);
  // The close is taken within the prober's next pass (10 ms at most); a
  // probe already on its way may still come.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  answer(responder);
  int after = 0;
  const auto quiet_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < quiet_until) {
    after += answer(responder);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(after, 0) << "a closed node is not probed";
}

}  // namespace
}  // namespace rankscope::sim
