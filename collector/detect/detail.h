#pragma once
// Detail on demand (docs/gpu-timing.md). NCCL's proxy steps say which link
// is slow, at about 4 µs of NCCL's proxy thread per collective, so the
// collector asks for them only where something is suspected. It wants them
// for a communicator while
//   - a finding of it is open (a straggler, a slow link, a hang): to name
//     the link, and to see it end;
//   - the link detector saw one of its links beyond the others among its
//     last sampled collectives (the agents' background sampling caught
//     something);
//   - its collectives' shortest kernel grew. Per collective, the rank whose
//     kernels started last on the GPU runs the shortest kernel: it finds
//     every peer ready, so its kernel time is the transfer's own, whoever
//     was late, with no clock shared across nodes. A slow link or a slow
//     GPU stretches it; a host that issues late does not;
// and for a hold time after the last of these, so that the link detector
// sees enough sampled collectives to decide either way. The agent of each
// node with members in a wanted communicator is told in the reply to its
// heartbeat (wire DetailRequest).
//
// NCCL decides per operation, when it is enqueued, whether it reports
// proxy steps: a collective already in flight when they are asked for is
// never seen step by step. A hang is localised by its proxy steps only
// where they were on when its collective was enqueued.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "collector/detect/findings.h"
#include "collector/detect/link.h"
#include "collector/match/gpu_matcher.h"
#include "collector/model/cluster.h"

namespace rankscope::collector {

struct DetailOptions {
  uint64_t hold_ns = 30'000'000'000ull;  // wanted this long after the last reason
  size_t history = 64;                   // shortest kernels kept per communicator, op and size
  size_t recent = 8;                     // the median of the last this many ...
  size_t min_baseline = 16;              // ... against the lower quartile of at least this many before them
  double rise = 2.0;                     // suspected at this many times the baseline
  uint64_t floor_ns = 1'000'000;         // ... and at least this much more
  size_t keys_per_comm = 32;             // (op, size) pairs followed per communicator
};

class DetailPolicy final : public GpuListener {
 public:
  DetailPolicy(const ClusterModel& model, const FindingBook& book, const LinkDetector& links,
               DetailOptions options = {});
  void on_gpu_complete(const GpuComplete& done) override;
  // Decides which communicators are wanted now (`now_ns`: cluster clock),
  // and of which nodes' agents.
  void evaluate(uint64_t now_ns);
  // Per node, the communicators (sorted) whose proxy steps its agent is
  // asked for; nodes with none are absent.
  const std::map<std::string, std::vector<uint64_t>>& by_node() const { return by_node_; }
  size_t wanted_comms() const { return wanted_.size(); }
  // Times a communicator became wanted, by reason.
  struct Counts {
    uint64_t finding = 0, link = 0, rise = 0;
  };
  const Counts& counts() const { return counts_; }

 private:
  enum class Reason { finding, link, rise };
  struct Wanted {
    uint64_t until_ns = 0;
    Reason reason = Reason::finding;
  };
  void want(uint64_t comm, Reason reason, uint64_t at_ns);  // held hold_ns from `at_ns`
  using Key = std::tuple<uint64_t, uint8_t, uint64_t>;  // (comm, op, count)

  const ClusterModel& model_;
  const FindingBook& book_;
  const LinkDetector& links_;
  DetailOptions options_;
  std::map<Key, std::deque<uint64_t>> shortest_;  // shortest kernel per collective, oldest first
  std::map<uint64_t, size_t> keys_;               // per communicator, its keys in shortest_
  std::map<uint64_t, bool> rose_;                 // communicators whose shortest kernel rose since the last evaluate
  std::map<uint64_t, Wanted> wanted_;
  std::map<std::string, std::vector<uint64_t>> by_node_;
  Counts counts_;
};

}  // namespace rankscope::collector
