#pragma once
// When to send a batch again that the collector has not acknowledged: the
// retransmission timer of TCP (RFC 6298) over the round trip of batch and
// ack. A collector working through a backlog acknowledges late, not never;
// with a fixed timeout every agent then re-sent everything in flight on top
// of that backlog (600,000 duplicate batches in a 75 s run of 1,024 nodes),
// and the collector fell further behind. The wait follows the acks' round
// trip (smoothed, plus four times its variation), never below the
// configured timeout, and doubles with each re-send of the same batch.
// Used by the node agent (node-agent/transport.cpp) and by rankscope-sim,
// which must behave as agents do.
#include <algorithm>
#include <cstdint>

namespace rankscope {

class AckTimer {
 public:
  // `min_ns`: the configured ack timeout (the wait is never shorter);
  // `max_ns`: the longest wait, however slow the collector.
  AckTimer(uint64_t min_ns, uint64_t max_ns) : min_ns_(min_ns), max_ns_(std::max(min_ns, max_ns)) {}

  // A batch sent once was acknowledged `rtt_ns` after it was sent. (Karn's
  // rule: the ack of a re-sent batch says nothing of which send it answers;
  // callers leave those out.)
  void sample(uint64_t rtt_ns) {
    if (srtt_ns_ == 0) {
      srtt_ns_ = std::max<uint64_t>(rtt_ns, 1);
      rttvar_ns_ = rtt_ns / 2;
      return;
    }
    uint64_t diff = srtt_ns_ > rtt_ns ? srtt_ns_ - rtt_ns : rtt_ns - srtt_ns_;
    rttvar_ns_ = (3 * rttvar_ns_ + diff) / 4;
    srtt_ns_ = std::max<uint64_t>((7 * srtt_ns_ + rtt_ns) / 8, 1);
  }

  // The wait for the ack of a batch sent once: the smoothed round trip plus
  // four times its variation, within [min, max].
  uint64_t timeout_ns() const {
    if (srtt_ns_ == 0) return min_ns_;
    return std::clamp(srtt_ns_ + 4 * rttvar_ns_, min_ns_, max_ns_);
  }

  // The wait for a batch already re-sent `resends` times: doubled each time, up to max.
  uint64_t wait_ns(uint32_t resends) const {
    uint64_t wait = timeout_ns() << std::min<uint32_t>(resends, 5);
    return std::max(min_ns_, std::min(wait, max_ns_));
  }

  // A new connection (a collector welcomed us anew): what was learnt of the old one no longer holds.
  void reset() { srtt_ns_ = rttvar_ns_ = 0; }

 private:
  uint64_t min_ns_, max_ns_;
  uint64_t srtt_ns_ = 0, rttvar_ns_ = 0;
};

}  // namespace rankscope
