#pragma once
// Slow links, from NCCL's proxy steps (docs/gpu-timing.md): where the agents
// ask the profiler plugin for them, each rank's GPU record of a collective
// says which of its send links waited longest on the network, and for how
// long: from when NCCL's proxy handed a step's data to the network until the
// network was done with it. That time is the link's own. A rank that
// arrives late or a slow GPU changes when transfers are handed over, not how
// long the network then takes; a slow link stretches it on that link alone,
// while the other links' transfers wait for data instead (measured on an
// H100 with NCCL 2.28: docs/benchmarks.md).
//
// Per collective, the link that waited longest is beyond the others when
// its wait exceeds their median by the floor and by the ratio. A link
// beyond the others at most collectives of a window is slow: one finding
// per link (sender, receiver), resolved once it is beyond at few of them.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>

#include "collector/detect/findings.h"
#include "collector/match/gpu_matcher.h"
#include "collector/model/cluster.h"

namespace rankscope::collector {

struct LinkOptions {
  uint64_t floor_ns = 2'000'000;  // beyond the others' median by at least this (the exchange floor of stragglers)
  double ratio = 3.0;             // ... and at least this many times it
  size_t window = 64;             // collectives with link waits kept per communicator
  size_t min_collectives = 16;    // judged on at least this many
  double open_share = 0.5;        // one link beyond the others at this share of them: slow
  double close_share = 0.2;       // ... no longer, below this share
};

class LinkDetector final : public GpuListener {
 public:
  LinkDetector(const ClusterModel& model, FindingBook& book, LinkOptions options = {});
  void on_gpu_complete(const GpuComplete& done) override;
  // Raises, updates and resolves slow-link findings; `now_ns` is the cluster clock.
  void evaluate(uint64_t now_ns);
  size_t tracked_comms() const { return comms_.size(); }
  // When the last of communicator `comm`'s last min_collectives sampled
  // collectives in which a link was beyond the others ended (cluster
  // clock); 0: none was (a lead, not a finding).
  uint64_t suspected_at(uint64_t comm) const;

 private:
  // One collective whose ranks' link waits were seen (two ranks at least).
  struct Sample {
    int32_t rank = -1;       // the sender of the link beyond the others; -1: none was
    int32_t peer = -1;       // its receiver
    uint64_t wait_ns = 0;    // its wait
    uint64_t others_ns = 0;  // the median of the other ranks' longest waits
    uint64_t kernel_ns = 0;  // the collective's longest kernel (its GPU time)
    uint64_t ended_ns = 0;   // its earliest rank's kernel end, cluster clock (0: none)
  };
  struct CommLinks {
    std::deque<Sample> window;
  };
  void evaluate_comm(const CommState& comm, const CommLinks& links, uint64_t now_ns);

  const ClusterModel& model_;
  FindingBook& book_;
  LinkOptions options_;
  std::map<uint64_t, CommLinks> comms_;
};

}  // namespace rankscope::collector
