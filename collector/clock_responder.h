#pragma once
// Clock probes answered on a thread and a socket of their own.
//
// A probe's `t2` is the moment the collector reads it. On the agents'
// socket a probe is read between two batches at best, and after an
// evaluation or a commit's staging at worst: the wait reads as a long way
// in, and the node's offset comes out late by half of it. Here nothing
// queues ahead of a probe: the thread sleeps in poll, stamps `t2` as the
// probe is read and `t3` as the reply goes. Agents learn the port from
// their HelloReply (clockPort) and reach it at the host of their
// connection; an agent that cannot (a port a firewall or a Service does not
// forward) probes on its connection, as before.
//
// The socket has a ZeroMQ context of its own, so that its I/O thread
// (which reads and decrypts what comes in, before this thread sees it) is
// not the one busy reading the agents' batches. Same CurveZMQ keys and
// allow-list as the agents' socket (its ZAP domain, served by a ZAP
// handler of its own context): an unknown key is refused at the handshake. A probe tells its sender the
// collector's time and nothing else, and changes nothing here: the samples
// reach the collector's model only in the batches of an accepted agent.
// Each key (connection, with --insecure) is answered at most
// kMaxProbesPerS a second, a burst of as many; the rest are dropped and
// counted. Anything that is not a probe is dropped and counted.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "collector/auth.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/result.h"

namespace rankscope::collector {

class ClockResponder {
 public:
  static constexpr uint32_t kMaxProbesPerS = 20;  // an agent sends one a second, and one per welcome
  // Binds `endpoint` (a port of "*": any free one) and starts the thread.
  // `key`: the collector's CurveZMQ key pair, its clients admitted by the
  // allow-list in `allow_dir` (null: --insecure, plaintext).
  static Result<std::unique_ptr<ClockResponder>> start(const std::string& endpoint, const curve::KeyFile* key,
                                                       const std::string& allow_dir, const Clock& clock);
  ~ClockResponder();
  ClockResponder(const ClockResponder&) = delete;
  ClockResponder& operator=(const ClockResponder&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // as bound (the port chosen)
  uint16_t port() const { return port_; }
  uint64_t answered() const { return answered_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Its handshakes, by the allow-list's answer (none with --insecure).
  uint64_t keys_admitted() const { return zap_ ? zap_->admitted() : 0; }
  uint64_t keys_refused() const { return zap_ ? zap_->refused() : 0; }

 private:
  explicit ClockResponder(const Clock& clock);
  void serve();

  zmq::context_t context_{1};
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t socket_;
  const Clock& clock_;
  std::string endpoint_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> answered_{0}, dropped_{0};
  std::thread thread_;
};

// The endpoint `--clock-listen` names: "auto" is --listen's host with any
// free port, "none" is "" (probes on the agents' socket only); anything
// else as it is.
std::string clock_endpoint(const std::string& clock_listen, const std::string& listen);

}  // namespace rankscope::collector
