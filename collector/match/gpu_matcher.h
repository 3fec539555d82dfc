#pragma once
// The GPU side of the collectives, matched across ranks: NCCL's profiler
// plugin reports, per rank, when each collective's kernels started and
// stopped on its GPU (docs/gpu-timing.md). A GPU instance is (communicator,
// op, NCCL's seqNumber): NCCL numbers each communicator's collectives per
// op, equally on every rank. It is complete once every member's GPU
// reported it; then the listeners hear each rank's kernel start (its
// arrival on the GPU side), enqueue and kernel end on the cluster clock.
//
// A rank's kernels can only exchange data once every rank's have started:
// the last kernel start is the GPU-side release, as the last issue is the
// host side's. Open instances are charged to an OpenBudget, as the
// collective matcher's are.
#include <cstdint>
#include <map>
#include <vector>

#include "collector/match/open_budget.h"
#include "collector/model/cluster.h"

namespace rankscope::collector {

struct GpuComplete {
  const CommState& comm;
  uint8_t op;
  uint64_t seq;                               // NCCL's, per communicator and op
  const std::vector<uint64_t>& kernel_start;  // by rank, cluster clock
  const std::vector<uint64_t>& enqueued;      // by rank
  const std::vector<uint64_t>& kernel_end;    // by rank
  // By rank, NCCL's proxy steps where they were asked for (GpuRecord): the
  // peer of its send link that waited longest on the network (-1: none
  // seen), and how long.
  const std::vector<int32_t>& link_peer;
  const std::vector<uint64_t>& link_wait;
  uint64_t count;  // elements, as the first rank's record said
};

class GpuListener {
 public:
  virtual ~GpuListener() = default;
  virtual void on_gpu_complete(const GpuComplete& done) = 0;
};

class GpuMatcher final : public RecordObserver {
 public:
  void subscribe(GpuListener& listener) { listeners_.push_back(&listener); }
  void on_gpu(const CommState& comm, int32_t rank, uint8_t op, const proto::GpuRecord& record) override;
  // Drops what is open of communicators that ended or that `comms` lacks.
  void sweep(const std::map<uint64_t, CommState>& comms);
  uint64_t open_bytes() const { return budget_.bytes(); }
  uint64_t completed() const { return completed_; }

 private:
  struct Open {
    std::vector<uint64_t> issue;  // kernel start by rank (0: not yet); named for the budget
    std::vector<uint64_t> enqueued, end;
    std::vector<int32_t> link_peer;
    std::vector<uint64_t> link_wait;
    uint64_t count = 0;
    int32_t arrived = 0;
  };
  using Instances = std::map<uint64_t, Open>;  // by seq << 8 | op: oldest first
  std::vector<GpuListener*> listeners_;
  std::map<uint64_t, Instances> comms_;
  OpenBudget budget_{4 * sizeof(uint64_t) + sizeof(int32_t)};
  uint64_t completed_ = 0;
};

}  // namespace rankscope::collector
